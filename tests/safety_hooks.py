"""A pluggable safety hook used by the tests (``safety.hook = "tests.safety_hooks:no_digits"``)."""


def no_digits(text: str) -> bool:
    return any(ch.isdigit() for ch in text)
