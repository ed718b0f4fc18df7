"""The one error type a user sees for a bad configuration or file."""


class LayerSkipConfigError(ValueError):
    """A bad `--speculative-config` for a layer-skip method, or a file it names
    (profile, heads, state, draft vocabulary) that cannot serve the running model.
    The message says what is wrong and what to do."""
