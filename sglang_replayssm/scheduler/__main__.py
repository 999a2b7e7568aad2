import sys

from .serve_app import main

sys.exit(main())
