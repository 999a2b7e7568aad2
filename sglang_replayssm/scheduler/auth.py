"""`--api-key` for the Ray router and its replicas' engines.

The router's ingress answers 401 (an OpenAI-style error, `http_front/auth.py`) to a request on
/v1/completions, /v1/chat/completions or /v1/models without `Authorization: Bearer <key>`; /health
and /metrics stay open. Every engine is started with the same `--api-key` (SGLang's and the native
server's flag), so an engine's port on its node answers no one without it, and each replica's HTTP
client sends the key to its engine (`KeyedEngineReplica`).
"""

from __future__ import annotations

from .engine_process import api_key_from_argv
from .replica import EngineReplica


class KeyedEngineReplica(EngineReplica):
    """An EngineReplica whose engine arguments carry `--api-key`: its client to the engine sends it.
    (The engine's /health and /metrics, which the replica also reads, are open anyway.)"""

    def _http(self):
        client = super()._http()
        if "authorization" not in client.headers:
            key = api_key_from_argv(self.engine.engine_argv)
            if key:
                client.headers["Authorization"] = f"Bearer {key}"
        return client
