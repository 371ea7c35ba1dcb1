"""The Gemma 4 text-stack keys, read from a config as llama.cpp's converter reads it
(transformers 5.x rules) and written as it writes them."""

import pytest
from gguf import GGUFValueType

from gguf_exact.errors import GgufExactError
from gguf_exact.gemma4.assistant import AssistantConfig, expected_shape, metadata
from gguf_exact.gemma4.hparams import TextHparams, text_fields
from gguf_exact.gemma4.sizes import SIZES
from gguf_exact.tiny.models import TinyDrafter, drafter_config


def text(**changes) -> dict:
    """The 31B assistant's text_config with ``changes`` (None deletes a key)."""
    t = SIZES["31B"].assistant.config()["text_config"]
    for key, value in changes.items():
        if value is None:
            t.pop(key, None)
        else:
            t[key] = value
    return t


def fields(arch: str, hp: TextHparams) -> dict:
    return {f.key.removeprefix(arch + "."): f for f in text_fields(arch, hp)}


def test_global_kv_heads_give_a_per_layer_head_count():
    hp = TextHparams.from_hf(text(), assistant=True)
    f = fields("a", hp)["attention.head_count_kv"]
    assert (f.value, f.vtype, f.sub_type) == ([16, 16, 16, 4], GGUFValueType.ARRAY, GGUFValueType.INT32)
    assert [hp.n_embd_k_gqa(il) for il in range(4)] == [16 * 256, 16 * 256, 16 * 256, 4 * 512]


def test_global_kv_heads_apply_only_with_k_eq_v():
    # transformers 5.x moves num_global_key_value_heads into per_layer_config only with attention_k_eq_v
    hp = TextHparams.from_hf(text(attention_k_eq_v=False), assistant=True)
    f = fields("a", hp)["attention.head_count_kv"]
    assert (f.value, f.vtype) == (16, GGUFValueType.UINT32)


def test_per_layer_config_wins_and_gives_the_full_head_dim():
    per_layer = {"3": {"head_dim": 128, "num_key_value_heads": 2}}
    hp = TextHparams.from_hf(
        text(global_head_dim=None, num_global_key_value_heads=None, per_layer_config=per_layer), assistant=True
    )
    assert hp.head_dim_full == 128 and hp.n_head_kv == (16, 16, 16, 2)
    assert fields("a", hp)["attention.key_length"].value == 128


def test_double_wide_mlp_doubles_the_kv_shared_layers():
    t = SIZES["E2B"].target.text_config() | {"num_hidden_layers": 5, "num_kv_shared_layers": 2}
    t["layer_types"] = t["layer_types"][:5]
    hp = TextHparams.from_hf(t)
    f = fields("gemma4", hp)["feed_forward_length"]
    assert (f.value, f.sub_type) == ([6144, 6144, 6144, 12288, 12288], GGUFValueType.INT32)


def test_assistant_layers_all_read_shared_kv():
    hp = TextHparams.from_hf(text(num_kv_shared_layers=0), assistant=True)
    assert hp.n_kv_shared == 4  # as Gemma4AssistantConfig sets it


def test_sliding_rotary_fraction_is_read_from_the_top_level():
    t = text()
    t["rope_parameters"]["sliding_attention"]["partial_rotary_factor"] = 0.5  # nested: upstream ignores it
    assert fields("a", TextHparams.from_hf(t))["rope.dimension_count_swa"].value == 256
    t["rope_parameters"]["partial_rotary_factor"] = 0.5
    assert fields("a", TextHparams.from_hf(t))["rope.dimension_count_swa"].value == 128


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6}}},
            "rope_parameters.full_attention.rope_type is 'default'; llama.cpp's Gemma 4 implements only 'proportional'",
        ),
        (
            {
                "rope_parameters": {
                    "sliding_attention": {"rope_type": "linear", "factor": 2.0},
                    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25},
                }
            },
            "sliding_attention.rope_type is 'linear'; llama.cpp applies no rope scaling",
        ),
        ({"global_head_dim": None}, "missing text_config.global_head_dim"),
        ({"layer_types": ["sliding_attention"] * 3}, "has 3 entries for 4 layers"),
        ({"layer_types": ["sliding_attention"] * 3 + ["chunked_attention"]}, "unknown entry"),
        ({"per_layer_config": {"0": {"head_dim": 64}}}, "per_layer_config has no full-attention layer"),
    ],
)
def test_bad_text_configs_are_one_line_errors(change, message):
    with pytest.raises(GgufExactError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        TextHparams.from_hf(text(**change), "cfg.json")
    assert str(err.value).startswith("cfg.json: ") and "\n" not in str(err.value)


def test_assistant_as_wide_as_its_target_is_refused():
    config = drafter_config(TinyDrafter(hidden_size=128, backbone_hidden_size=128))
    with pytest.raises(GgufExactError, match="backbone_hidden_size 128 equals text_config.hidden_size"):
        AssistantConfig.from_hf(config, "config.json")


def test_assistant_keys_end_with_the_drafters_two():
    cfg = AssistantConfig.from_hf(SIZES["26B-A4B"].assistant.config())
    keys = [f.key for f in metadata(cfg)]
    assert keys[-2:] == ["gemma4-assistant.embedding_length_out", "gemma4-assistant.nextn_predict_layers"]
    assert len(keys) == len(set(keys)) == 21  # what upstream writes for an assistant (make parity)


def test_e2b_and_e4b_assistants_add_the_ordered_heads_two_keys():
    for size in ("E2B", "E4B"):
        cfg = AssistantConfig.from_hf(SIZES[size].assistant.config())
        assert (cfg.head.num_centroids, cfg.head.top_k, cfg.candidates) == (2048, 32, 4096)
        fields = metadata(cfg)
        assert [(f.key, f.value) for f in fields[-2:]] == [
            ("gemma4-assistant.num_centroids", 2048),
            ("gemma4-assistant.centroid_intermediate_top_k", 32),
        ]
        assert len(fields) == 23 and [f.key for f in metadata(cfg.full_head())] == [f.key for f in fields[:-2]]
    assert AssistantConfig.from_hf(SIZES["31B"].assistant.config()).head is None


def test_expected_shapes_follow_each_layers_width():
    config = SIZES["31B"].assistant.config()
    config["text_config"]["use_double_wide_mlp"] = True  # a raw config transformers would refuse
    cfg = AssistantConfig.from_hf(config)
    assert expected_shape("blk.0.ffn_gate.weight", cfg) == (2 * 8192, 1024)
    assert expected_shape("blk.3.attn_q.weight", cfg) == (32 * 512, 1024)
    assert expected_shape("blk.2.attn_q_norm.weight", cfg) == (256,)
    assert expected_shape("blk.4.attn_q.weight", cfg) is None  # no such layer
