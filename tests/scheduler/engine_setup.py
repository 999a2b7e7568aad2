"""Engine arguments for the scheduler tests' replicas: the native engine's built-in random-weight model on CPU
(`--model-path embedded`, the fastest to step; the launcher's default is a trained one)."""


def engine_argv(tmp):
    return ["--model-path", "embedded", "--device", "cpu", "--max-running-requests", "8", "--context-length", "1024"]
