"""The local stack (generation + preprocess + Envoy) as child processes: `make run` and the e2e tests."""

from services.stack.stack import Stack, StackConfig

__all__ = ["Stack", "StackConfig"]
