"""`python -m sglang_replayssm` is `python -m sglang_replayssm.launch`."""

import sys

from .launch import main

sys.exit(main())
