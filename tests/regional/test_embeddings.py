"""POST /v1/embeddings on a real regional node: the official openai client, the library's own vectors,
bad input answered OpenAI-shaped, and a model folder that fails to load (503 for embeddings, chat goes on)."""

from __future__ import annotations

import base64
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import numpy as np
import openai
import pytest

from cache.embedder import MiniLMEmbedder, limit_blas_threads, load_embedder
from regional.config import EmbeddingsConfig, RegionConfig
from regional.node import check_config
from tests.conftest import MODEL, Node, start_region

pytestmark = pytest.mark.slow

EMBEDDER = "all-minilm-l6-v2"
SMALL_ENGINE = {"max_sequences": 2, "kv_cache_tokens": 2048, "context_window": 512}
MAX_REQUEST_TOKENS = 512
TEXTS = [
    "Is it safe to drink tap water in London?",
    "Is it unsafe to drink tap water in London?",
    "Où se trouve la gare la plus proche ?",
    "Send 100 dollars to Ada.",
]


@pytest.fixture(scope="module")
def embed_region(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    node = start_region(
        tmp_path_factory.mktemp("embed-region"),
        engine=SMALL_ENGINE,
        embeddings={"load": "eager", "max_request_tokens": MAX_REQUEST_TOKENS},
    )
    yield node
    node.process.stop()


@pytest.fixture(scope="module")
def library() -> MiniLMEmbedder:
    limit_blas_threads(1)
    return load_embedder()


async def post(url: str, payload: object) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/embeddings", json=payload) as r:
        return r.status, await r.json(content_type=None)


def test_openai_client_gets_the_librarys_vectors(embed_region: Node, library: MiniLMEmbedder):
    """The official client (which asks for base64 and decodes it) gets the same vectors as the library."""
    client = openai.OpenAI(base_url=embed_region.url + "/v1", api_key="unused", max_retries=0)
    answer = client.embeddings.create(model=EMBEDDER, input=TEXTS)
    expected = library.embed(TEXTS)
    got = np.array([d.embedding for d in sorted(answer.data, key=lambda d: d.index)], dtype=np.float32)
    assert got.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(got, expected, atol=1e-6)
    assert answer.model == EMBEDDER
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == sum(library.count_tokens(TEXTS))
    one = client.embeddings.create(model=EMBEDDER, input=TEXTS[0], encoding_format="float")
    np.testing.assert_allclose(np.array(one.data[0].embedding, dtype=np.float32), expected[0], atol=1e-6)


async def test_wire_format_float_and_base64(embed_region: Node, library: MiniLMEmbedder):
    status, floats = await post(embed_region.url, {"model": EMBEDDER, "input": TEXTS[:2]})
    assert status == 200, floats
    assert floats["object"] == "list" and floats["model"] == EMBEDDER
    assert [(d["object"], d["index"]) for d in floats["data"]] == [("embedding", 0), ("embedding", 1)]
    assert floats["usage"] == {"prompt_tokens": 24, "total_tokens": 24}  # 12 word pieces each, [CLS]/[SEP] in
    vectors = np.array([d["embedding"] for d in floats["data"]], dtype=np.float32)
    # float32 -> JSON -> float32 is exact: the same bits as the library's own answer.
    np.testing.assert_array_equal(vectors, library.embed(TEXTS[:2]))
    status, packed = await post(
        embed_region.url, {"model": EMBEDDER, "input": TEXTS[:2], "encoding_format": "base64"}
    )
    assert status == 200, packed
    decoded = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in packed["data"]])
    np.testing.assert_array_equal(decoded, vectors)


async def test_models_and_health_name_the_embedder(embed_region: Node):
    async with aiohttp.ClientSession() as s:
        async with s.get(embed_region.url + "/v1/models") as r:
            ids = {m["id"] for m in (await r.json())["data"]}
        async with s.get(embed_region.url + "/health") as r:
            health = await r.json()
    assert {MODEL, EMBEDDER} <= ids
    assert health["embeddings"]["model"] == EMBEDDER
    assert health["embeddings"]["state"] == "ready" and health["embeddings"]["load_s"] > 0
    assert health["embeddings"]["backend"] == "onnxruntime"  # "auto", with onnxruntime installed


@pytest.mark.parametrize(
    ("payload", "status", "param", "code"),
    [
        ({"model": EMBEDDER, "input": "x", "dimensions": 128}, 400, "dimensions", "unsupported_parameter"),
        ({"model": EMBEDDER, "input": ""}, 400, "input", None),
        ({"model": EMBEDDER, "input": []}, 400, "input", None),
        ({"model": EMBEDDER, "input": ["fine", ""]}, 400, "input[1]", None),
        ({"model": EMBEDDER, "input": [101, 2023, 102]}, 400, "input", None),
        ({"model": EMBEDDER, "input": [[101, 102]]}, 400, "input", None),
        ({"model": EMBEDDER, "input": None}, 400, "input", None),
        ({"model": EMBEDDER}, 400, None, None),
        ({"model": EMBEDDER, "input": "x", "encoding_format": "int8"}, 400, "encoding_format", None),
        ({"model": EMBEDDER, "input": "x", "temperature": 0}, 400, "temperature", None),
        ({"model": "no-such-model", "input": "x"}, 404, "model", "model_not_found"),
        ({"model": MODEL, "input": "x"}, 404, "model", "model_not_found"),  # the chat model embeds nothing
        ({"model": EMBEDDER, "input": ["a"] * 2049}, 400, "input", None),
        # 64 texts of ~20 word pieces: over this node's max_request_tokens (512), refused before any work.
        ({"model": EMBEDDER, "input": ["word " * 18] * 64}, 400, "input", None),
        (["not", "an", "object"], 400, None, None),
    ],
)
async def test_bad_input_is_an_openai_error(embed_region: Node, payload, status, param, code):
    got, body = await post(embed_region.url, payload)
    assert got == status, body
    error = body["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["code"] == code
    if param is not None:
        assert (error["param"] or "").startswith(param), error
    # ... and the node keeps serving.
    ok, answer = await post(embed_region.url, {"model": EMBEDDER, "input": "still here"})
    assert ok == 200 and len(answer["data"][0]["embedding"]) == 384


async def test_a_body_that_is_not_json(embed_region: Node):
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            embed_region.url + "/v1/embeddings",
            data=b'{"model": "all-minilm',
            headers={"Content-Type": "application/json"},
        ) as r,
    ):
        assert r.status == 400
        assert (await r.json())["error"]["code"] == "invalid_json"


def test_a_model_that_fails_to_load_answers_503_and_chat_goes_on(tmp_path: Path):
    broken = tmp_path / "not-a-model"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    node = start_region(tmp_path, engine=SMALL_ENGINE, embeddings={"path": str(broken), "load": "eager"})
    try:
        client = openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0)
        for _ in range(2):  # the failure stays and keeps naming the folder
            with pytest.raises(openai.APIStatusError) as caught:
                client.embeddings.create(model=EMBEDDER, input="hello")
            assert caught.value.status_code == 503
            error = caught.value.body
            assert error["code"] == "embedder_unavailable" and str(broken) in error["message"]
            assert caught.value.response.headers["Retry-After"]
        chat = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Say hi."}], max_tokens=4, temperature=0
        )
        assert chat.choices[0].message.content is not None and chat.usage.completion_tokens >= 1
        with urllib.request.urlopen(node.url + "/health") as r:
            health = json.loads(r.read())
        assert health["status"] == "ok"
        assert health["embeddings"]["state"] == "failed" and str(broken) in health["embeddings"]["reason"]
    finally:
        node.process.stop()


def test_one_name_for_two_models_is_a_config_error():
    config = RegionConfig(embeddings=EmbeddingsConfig(aliases=[MODEL]))
    with pytest.raises(ValueError, match=r"embeddings\.model"):
        check_config(config)
    check_config(RegionConfig(embeddings=EmbeddingsConfig(enabled=False, aliases=[MODEL])))
