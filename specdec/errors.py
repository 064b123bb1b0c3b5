"""Errors specdec raises on bad input. Each message says what was wrong and what to do."""


class SpecDecError(Exception):
    """Base class of every error specdec raises on purpose."""


class ConfigError(SpecDecError, ValueError):
    """A config key or value that is not valid."""


class ModelLoadError(SpecDecError, ValueError):
    """A model, tokenizer or heads file that cannot be used."""


class IncompatibleModelsError(SpecDecError, ValueError):
    """Two models (or a model and its heads) that cannot work together."""


class InputError(SpecDecError, ValueError):
    """A prompt or generation argument that cannot be served."""


class MissingDependencyError(SpecDecError, ImportError):
    """An optional dependency that is not installed; the message names the extra that brings it."""


class StrategyError(SpecDecError, RuntimeError):
    """A strategy broke the protocol (e.g. a tree deeper than state.max_depth): a bug in that strategy."""


class StreamSupersededError(InputError):
    """No longer raised: calls on one Speculator each run on state of their own, so a newer call
    never supersedes an unfinished stream. Kept so that code catching it still imports."""
