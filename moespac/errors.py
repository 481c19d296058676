"""User-facing errors: one line that names the offending key, file or value."""


class MoespacError(Exception):
    """An error caused by user input or environment; the CLI prints it on one line and exits 2."""


def require(condition: bool, message: str) -> None:
    """Raise MoespacError(message) unless condition holds."""
    if not condition:
        raise MoespacError(message)


def check_unit_interval(what: str, value) -> None:
    """A share (cache ratio, acceptance rate) lies in [0, 1]; None means 'not given' and passes."""
    if value is not None and not 0.0 <= value <= 1.0:
        raise MoespacError(f"{what} {value} outside [0, 1]")


def check_context(what: str, prompt_tokens: int, max_new_tokens: int, gamma: int, context: int,
                  whose: str = "the target's") -> None:
    """A prompt, its new tokens and the gamma + 1 positions a verify pass runs past the text must fit the context
    (one rule and one message for the engine, the bench harness and the workflow config)."""
    if prompt_tokens + max_new_tokens + gamma + 1 > context:
        window = f" + a draft window of {gamma + 1} (gamma {gamma})" if gamma else ""
        raise MoespacError(f"{what} + {max_new_tokens} new tokens{window} does not fit {whose} context of "
                           f"{context} tokens")
