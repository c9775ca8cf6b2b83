"""What ``bench load`` asks: a seeded mix of chat requests that exercises the caches a server has.

Every request is ``[system, user: context, assistant: "Noted.", user: question]``:

- the system prompt is one of a few shared ones, so a server's prefix cache can reuse its KV blocks;
- the context turn carries the request's input length (filler words drawn from the input distribution);
- the last turn is a short question, which is what the edge's semantic cache embeds. A fresh question is a
  new (aspect, subject, place) triple; a *repeat* is an earlier request sent again byte for byte (the
  exact cache); a *paraphrase* is an earlier request whose question is worded another way (the semantic
  cache), its system prompt and context unchanged.

``max_tokens`` is drawn from the output distribution. Requests are temperature 0 by default, since the
edge caches only those. Lengths are counted in words; the usage the server reports gives the tokens.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

ASPECTS = [
    "rainfall", "electricity prices", "mobile money", "road quality", "school fees", "fuel subsidies",
    "port congestion", "exchange rates", "solar power", "internet latency", "crop prices", "tourism",
    "interest rates", "river levels", "air quality", "housing costs", "rail freight", "cloud outages",
    "water supply", "shipping rates",
]  # fmt: skip
SUBJECTS = [
    "small farmers", "street traders", "hospitals", "fishing fleets", "software startups", "bakeries",
    "bus operators", "universities", "textile mills", "cocoa exporters", "banks", "pharmacies",
    "call centres", "breweries", "cement plants", "coffee growers", "ride-hailing drivers", "clinics",
    "radio stations", "printing shops",
]  # fmt: skip
PLACES = [
    "Lagos", "Nairobi", "Accra", "Kigali", "Dakar", "Kampala", "Abuja", "Mombasa", "Lusaka", "Harare",
    "Addis Ababa", "Dar es Salaam", "Kano", "Ibadan", "Kumasi", "Cotonou", "Lome", "Douala", "Luanda",
    "Maputo",
]  # fmt: skip
# One question, worded three ways: index 0 for fresh questions, the others for paraphrases (worded in ways
# the cache's verifier explains: a moved phrase, a polite framing).
TEMPLATES = [
    "How does {aspect} affect {subject} in {place}?",
    "In {place}, how does {aspect} affect {subject}?",
    "Can you tell me how {aspect} affects {subject} in {place}?",
]
FILLER_TEXT = (
    "the report notes that demand grew steadily over the last quarter while supply stayed flat and "
    "several operators said costs rose faster than their prices because of transport delays and "
    "currency swings across the region"
)
FILLER = FILLER_TEXT.split(" ")
WORDS_PER_TOKEN = 0.75  # English text: about four tokens for three words


@dataclass(frozen=True)
class LengthDist:
    """A length in tokens: ``fixed:N`` (or ``N``), ``uniform:LO-HI``, ``lognormal:MEAN[:SIGMA]``."""

    kind: str
    low: float
    high: float = 0.0  # uniform's upper bound; lognormal's sigma

    @classmethod
    def parse(cls, text: str) -> LengthDist:
        kind, _, rest = text.partition(":") if ":" in text else ("fixed", "", text)
        try:
            if kind == "fixed":
                dist = cls("fixed", float(rest))
            elif kind == "uniform":
                low, high = rest.split("-")
                dist = cls("uniform", float(low), float(high))
            elif kind == "lognormal":
                mean, _, sigma = rest.partition(":")
                dist = cls("lognormal", float(mean), float(sigma or 0.5))
            else:
                raise ValueError(kind)
        except ValueError:
            raise ValueError(
                f"a length is fixed:N, uniform:LO-HI or lognormal:MEAN[:SIGMA], not {text!r}"
            ) from None
        if dist.low < 1 or (kind == "uniform" and dist.high < dist.low) or dist.high < 0:
            raise ValueError(f"a length needs positive bounds in order: {text!r}")
        return dist

    def sample(self, rng: random.Random) -> int:
        if self.kind == "uniform":
            return rng.randint(int(self.low), int(self.high))
        if self.kind == "lognormal":
            sigma = self.high
            # mu set so that the distribution's mean (not its median) is the given mean
            return max(1, round(rng.lognormvariate(math.log(self.low) - sigma**2 / 2, sigma)))
        return int(self.low)

    def __str__(self) -> str:
        if self.kind == "uniform":
            return f"uniform:{self.low:g}-{self.high:g}"
        if self.kind == "lognormal":
            return f"lognormal:{self.low:g}:{self.high:g}"
        return f"fixed:{self.low:g}"


@dataclass(frozen=True)
class LoadRequest:
    kind: str  # fresh | repeat | paraphrase
    body: bytes
    max_tokens: int


@dataclass
class PromptMix:
    model: str
    system_prompts: int = 4
    system_tokens: int = 64
    repeat_share: float = 0.1
    paraphrase_share: float = 0.1
    input_tokens: LengthDist = field(default_factory=lambda: LengthDist("uniform", 32, 128))
    output_tokens: LengthDist = field(default_factory=lambda: LengthDist("fixed", 32))
    temperature: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if (
            self.repeat_share < 0
            or self.paraphrase_share < 0
            or self.repeat_share + self.paraphrase_share > 1
        ):
            raise ValueError("repeat and paraphrase shares must be at least 0 and add up to at most 1")
        if self.system_prompts < 1:
            raise ValueError("at least one system prompt")

    def requests(self) -> Iterator[LoadRequest]:
        """An endless seeded sequence of requests: the same seed gives the same requests in order."""
        rng = random.Random(self.seed)
        systems = [self._system_prompt(i) for i in range(self.system_prompts)]
        sent: list[_Fresh] = []
        unused = [(a, s, p) for a in ASPECTS for s in SUBJECTS for p in PLACES]
        rng.shuffle(unused)
        while True:
            draw = rng.random()
            if sent and draw < self.repeat_share:
                first = rng.choice(sent)  # byte for byte, max_tokens included
                yield LoadRequest("repeat", first.request.body, first.request.max_tokens)
            elif sent and draw < self.repeat_share + self.paraphrase_share:
                first = rng.choice(sent)
                question = _question(rng.randrange(1, len(TEMPLATES)), first.triple)
                body = self._body(first.system, first.context, question, first.request.max_tokens)
                yield LoadRequest("paraphrase", body, first.request.max_tokens)
            else:
                system = rng.choice(systems)
                context = _filler(rng, self.input_tokens.sample(rng))
                triple = unused.pop() if unused else (rng.choice(ASPECTS), rng.choice(SUBJECTS), "town")
                max_tokens = self.output_tokens.sample(rng)
                request = LoadRequest(
                    "fresh", self._body(system, context, _question(0, triple), max_tokens), max_tokens
                )
                sent.append(_Fresh(system, context, triple, request))
                yield request

    def _system_prompt(self, index: int) -> str:
        words = _filler(random.Random(f"system-{index}"), self.system_tokens)
        return f"You are analyst number {index}. Answer briefly and plainly. Background: {words}"

    def _body(self, system: str, context: str, question: str, max_tokens: int) -> bytes:
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Context: {context}"},
            {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": question},
        ]
        body = {
            "model": self.model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": self.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        return json.dumps(body).encode()


@dataclass(frozen=True)
class _Fresh:
    system: str
    context: str
    triple: tuple[str, str, str]  # aspect, subject, place
    request: LoadRequest


def _question(template: int, triple: tuple[str, str, str]) -> str:
    return TEMPLATES[template].format(aspect=triple[0], subject=triple[1], place=triple[2])


def _filler(rng: random.Random, tokens: int) -> str:
    count = max(1, round(tokens * WORDS_PER_TOKEN))
    start = rng.randrange(len(FILLER))
    return " ".join(FILLER[(start + i) % len(FILLER)] for i in range(count))
