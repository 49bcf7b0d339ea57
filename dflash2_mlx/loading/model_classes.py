"""Which mlx-lm classes build a config: mlx-lm's model-type lookup, through its public names.

mlx-lm's `load_model` picks `mlx_lm.models.<model_type>` after its public
remapping tables (`MODEL_ARCHITECTURE_REMAPPING` for a type that several
architectures share, then `MODEL_REMAPPING`). The function that does it,
`mlx_lm.utils._get_classes`, is private; this is the same lookup on the public
tables and module names, so the checks that build a model before loading it
(preflight, target_checks, the synthetic checkpoints) name the classes
`load_model` will use.
"""

import importlib


def model_classes(config: dict) -> tuple:
    """(Model, ModelArgs) for a model config; ValueError for a type mlx-lm does not have."""
    import mlx_lm.utils as lm_utils  # 1 s of imports: keep lazy

    model_type = config["model_type"]
    architectures = config.get("architectures") or ()
    if isinstance(architectures, str):
        architectures = (architectures,)
    by_architecture = getattr(lm_utils, "MODEL_ARCHITECTURE_REMAPPING", {})
    remapped = next((by_architecture[(model_type, a)] for a in architectures if (model_type, a) in by_architecture),
                    None)
    model_type = remapped if remapped is not None else lm_utils.MODEL_REMAPPING.get(model_type, model_type)
    try:
        arch = importlib.import_module(f"mlx_lm.models.{model_type}")
    except ImportError as e:
        raise ValueError(f"Model type {model_type} not supported.") from e
    return arch.Model, arch.ModelArgs
