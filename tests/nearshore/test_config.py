"""Config files decode into Structs; errors name the file and the key."""

import msgspec
import pytest

from nearshore.config import ConfigError, load_config
from nearshore.protocol.errors import from_validation_error
from nearshore.protocol.schemas import chat_request_decoder
from regional.config import RegionConfig


def test_defaults_without_a_file():
    config = load_config(None, RegionConfig)
    assert config.server.port == 8100 and config.engine.max_sequences == 16 and config.model.path == ""


def test_the_shipped_region_config_is_valid():
    config = load_config("configs/region.toml", RegionConfig)
    assert config.name == "london" and config.engine.context_window <= config.engine.kv_cache_tokens


def test_the_shipped_small_model_config_is_valid_and_names_smollm2():
    from regional.node import check_config

    config = load_config("configs/region-small.toml", RegionConfig)
    check_config(config)
    big = load_config("configs/region.toml", RegionConfig)
    assert config.model.name == "smollm2-135m" and config.model.path == "embedded:smollm2-135m-instruct"
    assert config.model.chat_template == "auto" and config.server.port != big.server.port
    # The same settings as the Gemma node's file, but for the model and the port.
    strip = lambda c: msgspec.structs.replace(c, model=big.model, server=big.server)  # noqa: E731
    assert strip(config) == big


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[server]\nport = 70000\n", "server.port: Expected `int` <= 65535"),
        ('[engine]\nload = "sometimes"\n', "engine.load"),
        ("colour = 1\n", "colour: unknown key"),
        ('[safety]\nblocklist = [""]\n', "safety.blocklist[0]"),
        ("[server\n", "not valid TOML"),
    ],
)
def test_errors_name_file_and_key(tmp_path, text, expected):
    path = tmp_path / "region.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_config(path, RegionConfig)
    assert str(path) in str(error.value) and expected in str(error.value)


def test_validation_error_becomes_openai_error_with_param():
    import msgspec

    with pytest.raises(msgspec.ValidationError) as raised:
        chat_request_decoder.decode(b'{"model": "m", "messages": [{"role": "user", "content": 5}]}')
    error = from_validation_error(raised.value)
    assert error.status == 400 and error.param == "messages[0].content"
    body = msgspec.json.decode(error.to_json())
    assert body["error"]["type"] == "invalid_request_error"


def test_the_edge_configs_cache_section_documents_every_setting_at_its_default():
    import tomllib
    from pathlib import Path

    import msgspec

    from cache.settings import CacheSettings

    root = Path(__file__).resolve().parents[2]
    section = tomllib.loads((root / "configs" / "edge.toml").read_text())["cache"]
    defaults = msgspec.structs.asdict(CacheSettings())
    assert set(section) == set(defaults), set(section) ^ set(defaults)
    assert section == defaults


def test_the_edge_configs_key_share_section_documents_every_setting_at_its_default():
    import tomllib
    from pathlib import Path

    import msgspec

    from edge.config import EdgeConfig, KeyShareConfig

    root = Path(__file__).resolve().parents[2]
    section = tomllib.loads((root / "configs" / "edge.toml").read_text())["pools"]["key_share"]
    defaults = msgspec.structs.asdict(KeyShareConfig())
    assert set(section) == set(defaults), set(section) ^ set(defaults)
    assert section == defaults
    assert load_config(root / "configs" / "edge.toml", EdgeConfig).pools.key_share == KeyShareConfig()
