"""Loading an old run's config.yaml: a head refit's scikit-learn alpha becomes the weight decay that gives the
same regularisation, not the same number (core/jobargs.py refit_alpha_overrides)."""

from __future__ import annotations

import pytest
import yaml

from raypipe.core.config import ConfigError, dump_config, load_config
from raypipe.core.jobargs import job_parser, run_config_from_args
from raypipe.predict.head import equivalent_alpha, make_head
from raypipe.stopping.refit import resolve


def old_run(path, refits: list[dict], **train) -> None:
    """A run directory whose config.yaml has ``refits`` under stopping and ``train`` settings."""
    dump_config(load_config(), path / "config.yaml")
    tree = yaml.safe_load((path / "config.yaml").read_text())
    tree["stopping"]["refits"] = refits
    tree["train"].update(train)
    (path / "config.yaml").write_text(yaml.safe_dump(tree))


def loaded(path):
    return run_config_from_args(job_parser("test").parse_args([]), path)


@pytest.mark.parametrize("batch, alpha, decay", [(256, 0.01, 7.8125e-05), (64, 0.01, 3.125e-04), (256, 0.128, 1e-3)])
def test_an_old_refits_alpha_becomes_the_equivalent_weight_decay(tmp_path, batch, alpha, decay):
    old_run(
        tmp_path,
        [{"head_hidden": [32, 16], "head_alpha": alpha}, {"head_hidden": [8]}],
        head="sklearn",
        head_batch_size=batch,
    )
    config = loaded(tmp_path)
    converted, untouched = config.stopping.refits
    assert converted.head_weight_decay == pytest.approx(decay, rel=1e-12)  # 2 x alpha / B, by hand
    assert untouched.head_weight_decay == load_config().stopping.refits[0].head_weight_decay
    # the sklearn head refit with it (as raypipe.stopping.refit does: alpha follows the decay) has the old alpha
    resolved = resolve(converted, config.train)
    settings = resolved.model_dump(include={"head_hidden", "head_weight_decay", "head_learning_rate"})
    head = make_head(config.train.model_copy(update={**settings, "head_alpha": None}))
    assert head.named_steps["mlp"].alpha == pytest.approx(alpha, rel=1e-12)
    assert equivalent_alpha(converted.head_weight_decay, batch) == pytest.approx(alpha, rel=1e-12)


def test_an_ambiguous_or_unconvertible_old_refit_is_refused_naming_the_key(tmp_path):
    old_run(tmp_path, [{"head_alpha": 0.01, "head_weight_decay": 0.001}])
    with pytest.raises(ConfigError, match="both head_alpha .* and head_weight_decay"):
        loaded(tmp_path)
    old_run(tmp_path, [{"head_alpha": "strong"}])
    with pytest.raises(ConfigError, match="head_alpha='strong' is not a number"):
        loaded(tmp_path)
