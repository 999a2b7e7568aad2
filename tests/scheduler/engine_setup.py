"""Engine arguments for the scheduler tests' replicas: the native engine's built-in random-weight model on CPU
(`--model-path embedded`, the fastest to step; the launcher's default is a trained one), with a 1 MiB body limit
below the router's 8 MiB (test_request_size.py: a body between the two is the engine's 413, passed through)."""

ENGINE_MAX_REQUEST_BYTES = 1 << 20


def engine_argv(tmp):
    return ["--model-path", "embedded", "--device", "cpu", "--max-running-requests", "8", "--context-length", "1024",
            "--max-request-bytes", str(ENGINE_MAX_REQUEST_BYTES)]
