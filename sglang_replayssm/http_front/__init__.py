"""The HTTP pieces both front ends share, the native server (`native/server.py`) and the Ray router's ingress
(`scheduler/ingress.py`), one job a file:

* `errors.py`: the one error body (OpenAI's shape) every refusal answers with;
* `auth.py`: `--api-key` (the key check, the native server's middleware);
* `browser_guard.py`: the Host / Origin / Content-Type checks against browser pages, `LOOPBACK_HOSTS`.

It imports neither `native` nor `scheduler` (nor ray, nor sglang): both import it.
"""
