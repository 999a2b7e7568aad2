"""The HTTP pieces both front ends share, the native server (`native/server.py`) and the Ray router's ingress
(`scheduler/ingress.py`), one job a file:

* `errors.py`: the one error body (OpenAI's shape) every refusal answers with;
* `auth.py`: `--api-key` (the key check, the native server's middleware);
* `browser_guard.py`: the Host / Origin / Content-Type checks against browser pages, `LOOPBACK_HOSTS`;
* `body_limit.py`: `--max-request-bytes` (a body read up to the limit, the rest dropped, the 413's message);
* `json_checks.py`: NaN / Infinity and lone surrogates anywhere in a parsed body, named by their path;
* `openai_response.py`: the OpenAI response bodies and SSE chunks (`Choices`), a stream's logprobs joined;
* `prefix_hash.py`: prompt prefixes as chained block hashes (`block_hashes`, `BLOCK_CHARS`,
  `MAX_REPORTED_BLOCKS`), as engines report them and the router's prefix tree keys them.

It imports neither `native` nor `scheduler` (nor ray, nor sglang): both import it.
"""
