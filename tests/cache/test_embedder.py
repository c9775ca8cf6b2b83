"""The numpy sentence embedder against sentence-transformers' own vectors, and its pool off the event loop.

The reference vectors (tests/data/minilm_reference.npz) were made by sentence-transformers with torch,
outside the project's venv (tests/data/make_minilm_reference.py); these tests need neither.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from cache.embedder import (
    DEFAULT_NAME,
    EmbedderLoadError,
    MiniLMEmbedder,
    embedded_model_dir,
    limit_blas_threads,
    load_embedder,
)
from cache.embedder_pool import BACKGROUND_NICE, EmbedderBusy, EmbedderPool
from cache.settings import CacheSettings

REFERENCE = Path(__file__).parents[1] / "data" / "minilm_reference.npz"


BACKENDS = ["numpy", "onnxruntime"]


@pytest.fixture(scope="module", params=BACKENDS)
def embedder(request: pytest.FixtureRequest) -> MiniLMEmbedder:
    """Each test that takes it runs once per backend: numpy, and ONNX Runtime on the graph built here."""
    limit_blas_threads(1)  # as the pools do: 2 BLAS threads on 2 busy cores spin against each other
    loaded = load_embedder(backend=request.param)
    assert loaded.backend == request.param
    return loaded


@pytest.fixture(scope="module")
def reference() -> tuple[list[str], np.ndarray]:
    data = np.load(REFERENCE)
    return [str(s) for s in data["sentences"]], data["vectors"]


def test_vectors_match_sentence_transformers(embedder: MiniLMEmbedder, reference):
    """Parity with sentence-transformers' encode of the same model on 52 varied texts (scripts, emoji,
    code, empty, over 256 word pieces): cosine >= 0.9999 for every one."""
    sentences, expected = reference
    assert len(sentences) >= 50
    vectors = embedder.embed(sentences)
    cosines = (vectors * expected).sum(axis=1)
    worst = int(np.argmin(cosines))
    assert cosines.min() >= 0.9999, (sentences[worst], cosines[worst])


def test_shape_dtype_and_unit_norm(embedder: MiniLMEmbedder):
    vectors = embedder.embed(["one", "two words", "three words here"])
    assert vectors.shape == (3, embedder.dim) == (3, 384)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert embedder.embed([]).shape == (0, 384)
    assert embedder.name == DEFAULT_NAME


def test_a_batch_gives_each_text_its_own_vector(embedder: MiniLMEmbedder, reference):
    """Padding a short text beside long ones changes nothing, and the order of the answers is the input's."""
    sentences, _ = reference
    texts = sentences[:30]
    together = embedder.embed(texts)
    alone = np.stack([embedder.embed([t])[0] for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)


def test_long_texts_are_truncated_at_256_word_pieces(embedder: MiniLMEmbedder, reference):
    sentences, _ = reference
    long_text = max(sentences, key=len)
    assert embedder.max_tokens == 256
    assert embedder.count_tokens([long_text, long_text + " more words after the cut"]) == [256, 256]
    a, b = embedder.embed([long_text, long_text + " more words after the cut"])
    np.testing.assert_allclose(a, b, atol=1e-6)
    assert embedder.count_tokens(["hello world"]) == [4]  # [CLS] hello world [SEP]


def test_the_issue_figures_hold(embedder: MiniLMEmbedder):
    """The pairs quoted in issue 10: a negation is as close as a paraphrase, so cosine alone cannot decide."""
    a, b, c, d = embedder.embed(
        [
            "Is it safe to drink tap water in London?",
            "Is it unsafe to drink tap water in London?",
            "How do I convert Celsius to Fahrenheit?",
            "How do I convert Fahrenheit to Celsius?",
        ]
    )
    assert float(a @ b) > 0.98 and float(c @ d) > 0.98
    assert abs(float(a @ c)) < 0.2


def test_a_model_folder_that_does_not_load_names_its_path(tmp_path: Path):
    missing = tmp_path / "nowhere"
    with pytest.raises(EmbedderLoadError, match=str(missing)):
        load_embedder(str(missing))
    # A copy of the model with one file broken at a time: each error names the folder or the file.
    source = embedded_model_dir()
    for broken, content in (
        ("model.safetensors", b"not a safetensors file"),
        ("config.json", b"{not json"),
        ("tokenizer.json", b"[]"),
    ):
        folder = tmp_path / broken
        shutil.copytree(source, folder)
        (folder / broken).write_bytes(content)
        for backend in BACKENDS:
            with pytest.raises(EmbedderLoadError, match=str(folder)):
                load_embedder(str(folder), backend=backend)


def test_another_folder_with_the_same_layout_loads(tmp_path: Path, embedder: MiniLMEmbedder):
    folder = tmp_path / "copy"
    shutil.copytree(embedded_model_dir(), folder)
    other = load_embedder(str(folder), name="my-minilm", backend=embedder.backend)
    assert other.name == "my-minilm"
    np.testing.assert_array_equal(other.embed(["same"]), embedder.embed(["same"]))


def test_the_backends_agree(reference):
    """ONNX Runtime runs the very graph numpy does: the same vectors to float32 rounding."""
    sentences, _ = reference
    limit_blas_threads(1)
    numpy_vectors = load_embedder(backend="numpy").embed(sentences)
    ort_vectors = load_embedder(backend="onnxruntime").embed(sentences)
    np.testing.assert_allclose(ort_vectors, numpy_vectors, atol=2e-6)
    assert load_embedder().backend == "onnxruntime"  # "auto" takes it when installed


def test_the_int8_backend_stays_close_and_is_the_caches_default(reference):
    """int8 matrix products move each vector a little (cosine >= 0.97 to sentence-transformers') and keep
    the order of similarities that the cache's threshold relies on; the cache runs it by default."""
    sentences, expected = reference
    int8 = load_embedder(backend="auto-int8")
    assert int8.backend == "onnxruntime-int8"
    vectors = int8.embed(sentences)
    cosines = np.sum(vectors * expected, axis=1)
    assert cosines.min() >= 0.97 and cosines.mean() >= 0.99, (cosines.min(), cosines.mean())
    # pairwise similarities (what the threshold is set on) move by under a hundredth on average
    drift = np.abs(vectors @ vectors.T - expected @ expected.T)
    assert drift.mean() < 0.01 and drift.max() < 0.08, (drift.mean(), drift.max())
    assert CacheSettings().embedder_backend == "auto-int8"


def test_an_unknown_backend_is_a_load_error():
    with pytest.raises(EmbedderLoadError, match="backend"):
        load_embedder(backend="tpu")  # type: ignore[arg-type]


# --- the pool ------------------------------------------------------------------------------------------


async def test_pool_embeds_off_the_event_loop(embedder: MiniLMEmbedder, reference):
    """While a large batch is embedded the loop keeps ticking: no tick waits for the batch."""
    sentences, expected = reference
    pool = EmbedderPool(lambda: embedder, source="test", load_when="eager")
    await pool.start()
    try:
        gaps: list[float] = []

        async def ticker(stop: asyncio.Event) -> None:
            last = time.perf_counter()
            while not stop.is_set():
                await asyncio.sleep(0.005)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        stop = asyncio.Event()
        tick = asyncio.create_task(ticker(stop))
        started = time.perf_counter()
        done = await pool.embed_counted(sentences)
        batch_s = time.perf_counter() - started
        stop.set()
        await tick
        assert pool.state == "ready"
        np.testing.assert_allclose(done.vectors[: len(sentences)], expected, atol=1e-4)
        assert done.num_tokens == sum(embedder.count_tokens(sentences))
        assert len(gaps) >= 5 and max(gaps) < batch_s / 2, (max(gaps), batch_s)
    finally:
        await pool.close()


async def test_pool_bounds_its_queue(embedder: MiniLMEmbedder, reference):
    sentences, _ = reference
    pool = EmbedderPool(lambda: embedder, source="test", max_waiting=2)
    await pool.start()
    try:
        first = [asyncio.create_task(pool.embed(sentences[:8])) for _ in range(2)]
        await asyncio.sleep(0)
        with pytest.raises(EmbedderBusy):
            await pool.embed(["one too many"])
        await asyncio.gather(*first)
        assert (await pool.embed(["room again"])).shape == (1, 384)
    finally:
        await pool.close()


class InOrder:
    """The real embedder, noting what each call embedded and at what priority its thread ran."""

    def __init__(self, embedder: MiniLMEmbedder) -> None:
        self.embedder, self.calls = embedder, []

    def __getattr__(self, name: str) -> object:
        return getattr(self.embedder, name)

    def embed(self, texts: list[str]) -> np.ndarray:
        self.calls.append((list(texts), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
        return self.embedder.embed(texts)


async def test_background_work_yields_to_lookups_text_by_text(embedder: MiniLMEmbedder, reference):
    """An audit's three texts go one at a time on a lower-priority thread, and a lookup that comes
    meanwhile waits for none of them: the texts left wait until no lookup does."""
    sentences, expected = reference
    recorded = InOrder(embedder)
    pool = EmbedderPool(lambda: recorded, source="test", load_when="eager")
    await pool.start()
    try:
        await pool.embed(["warm"])
        recorded.calls.clear()
        judged = asyncio.create_task(pool.embed_background(sentences[:3]))
        await asyncio.sleep(0)  # the first background text is on its way
        lookups = [asyncio.create_task(pool.embed([s])) for s in sentences[3:5]]
        vectors = await judged
        await asyncio.gather(*lookups)
        order = [texts for texts, _ in recorded.calls]
        assert sorted(order) == sorted([[s] for s in sentences[:5]])  # one text a call
        assert max(order.index([s]) for s in sentences[3:5]) < order.index([sentences[1]])
        assert order.index([sentences[1]]) < order.index([sentences[2]])
        niceness = {texts[0]: nice for texts, nice in recorded.calls}
        own = os.getpriority(os.PRIO_PROCESS, 0)
        assert {niceness[s] for s in sentences[:3]} == {min(own + BACKGROUND_NICE, 19)}
        assert {niceness[s] for s in sentences[3:5]} == {own}
        np.testing.assert_allclose(vectors, expected[:3], atol=1e-4)  # as one batch would have given
    finally:
        await pool.close()


async def test_a_pool_that_yields_to_others_runs_its_callers_work_at_the_low_priority(
    embedder: MiniLMEmbedder,
):
    """A region's pool (yield_to_others): a flood of embeddings runs below the chat decode's priority, so
    it takes the CPU the decode leaves (issue 34, N16); the edge's pool keeps its lookups at its own."""
    recorded = InOrder(embedder)
    pool = EmbedderPool(lambda: recorded, source="test", load_when="eager", yield_to_others=True)
    await pool.start()
    try:
        await pool.embed(["a lookup"])
        await pool.embed_counted(["one", "two"], share_key="k")
        own = os.getpriority(os.PRIO_PROCESS, 0)
        assert {nice for _, nice in recorded.calls} == {min(own + BACKGROUND_NICE, 19)}
    finally:
        await pool.close()


async def test_pool_lazy_load_reports_its_time(tmp_path: Path):
    pool = EmbedderPool(load_embedder, source="the embedded model", load_when="lazy")
    await pool.start()
    try:
        assert pool.state == "unloaded"
        assert (await pool.embed(["hello"])).shape == (1, 384)
        assert pool.state == "ready" and pool.load_s > 0
    finally:
        await pool.close()


async def test_pool_with_a_model_that_fails_to_load(tmp_path: Path):
    missing = tmp_path / "no-model"
    pool = EmbedderPool(lambda: load_embedder(str(missing)), source=str(missing), load_when="eager")
    await pool.start()
    try:
        for _ in range(2):  # the failure stays, and says where
            with pytest.raises(EmbedderLoadError, match=str(missing)):
                await pool.embed(["hello"])
        assert pool.state == "failed" and str(missing) in (pool.failure or "")
    finally:
        await pool.close()
