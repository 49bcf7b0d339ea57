"""loading/model_classes.py: mlx-lm's model-type lookup through its public names."""

import mlx_lm.models.llama as llama
import mlx_lm.models.qwen3 as qwen3
import mlx_lm.utils as lm_utils
import pytest

from dflash2_mlx.loading.model_classes import model_classes


def test_a_type_names_its_module():
    assert model_classes({"model_type": "qwen3"}) == (qwen3.Model, qwen3.ModelArgs)


def test_mlx_lm_remapping_applies():
    assert lm_utils.MODEL_REMAPPING["mistral"] == "llama"
    assert model_classes({"model_type": "mistral"}) == (llama.Model, llama.ModelArgs)


@pytest.mark.parametrize("architectures", [["BailingMoeV3ForCausalLM"], "BailingMoeV3ForCausalLM"])
def test_architecture_remapping_comes_first(architectures):
    (model_type, arch), target = next(iter(lm_utils.MODEL_ARCHITECTURE_REMAPPING.items()))
    assert arch == "BailingMoeV3ForCausalLM"
    model_cls, _ = model_classes({"model_type": model_type, "architectures": architectures})
    assert model_cls.__module__ == f"mlx_lm.models.{target}"
    other, _ = model_classes({"model_type": model_type, "architectures": ["SomethingElse"]})
    assert other.__module__ == f"mlx_lm.models.{model_type}"


def test_an_unknown_type_is_a_value_error():
    with pytest.raises(ValueError, match="not_a_model not supported"):
        model_classes({"model_type": "not_a_model"})


def test_no_private_mlx_lm_lookup_in_the_package():
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    private = "_get_" + "classes"

    def uses(path):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and any(a.name == private for a in node.names):
                return True
            if isinstance(node, ast.Attribute) and node.attr == private:
                return True
        return False

    users = [p for folder in ("dflash2_mlx", "cli", "tests") for p in (root / folder).rglob("*.py") if uses(p)]
    assert users == []
