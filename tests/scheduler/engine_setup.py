"""Engine arguments for the scheduler tests' replicas: the native engine's built-in model on CPU."""


def engine_argv(tmp):
    return ["--device", "cpu", "--max-running-requests", "8", "--context-length", "1024"]
