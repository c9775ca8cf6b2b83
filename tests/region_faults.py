"""A regional node whose real model fails on purpose: ``python -m tests.region_faults --config FILE``.

A decode step whose batch holds the tokens of :data:`POISON` raises ``LlamaError``, as a broken llama.cpp
context would; everything else is the real node with the real model. Used by the tests of engine failure.
"""

from __future__ import annotations

import sys

from regional.llama_model import LlamaError, LlamaModel

POISON = " zqxj poison zqxj"


def _holds(tokens: list[int], part: list[int]) -> bool:
    return any(tokens[i : i + len(part)] == part for i in range(len(tokens) - len(part) + 1))


def install() -> None:
    real_decode = LlamaModel.decode

    def decode(self: LlamaModel, tokens, positions, seq_ids, want_logits) -> None:
        poison = self.tokenize(POISON, add_special=False, parse_special=False)
        if _holds(list(tokens), poison):
            raise LlamaError("injected fault: a poisoned batch")
        real_decode(self, tokens, positions, seq_ids, want_logits)

    LlamaModel.decode = decode  # type: ignore[method-assign]


def main() -> None:
    install()
    from cli import main as cli_main

    sys.exit(cli_main(["region", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
