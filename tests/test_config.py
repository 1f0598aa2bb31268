import pytest
import yaml

from raypipe.core.config import ConfigError, RunConfig, dump_config, load_config


def test_embedded_preset_loads():
    config = load_config("embedded")
    assert config.engine.model == "smollm2"
    assert config.agent.protocol == "search_r1"
    assert config.retrieval.actors.num_cpus == 0


def test_overrides_are_parsed_as_yaml():
    config = load_config("embedded", ["data.limit=3", "agent.probe=false", "data.datasets=[musique]"])
    assert config.data.limit == 3
    assert config.agent.probe is False
    assert config.data.datasets == ["musique"]


@pytest.mark.parametrize(
    "override,message",
    [
        ("engine.modle=x", r"engine.modle: unknown key"),
        ("agent.protocol=react", r"agent.protocol: Input should be 'search_r1' or 'r1_searcher'"),
        ("data.limit=0", r"data.limit: Input should be greater than or equal to 1"),
        ("nosection.x=1", r"nosection: unknown key"),
        ("engine.backend=openai", r"engine.backend=openai needs engine.base_url"),
    ],
)
def test_bad_values_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("embedded", [override])


def test_malformed_override():
    with pytest.raises(ConfigError, match="not of the form"):
        load_config("embedded", ["data.limit"])


def test_unknown_preset_lists_known_ones():
    with pytest.raises(ConfigError, match=r"unknown preset 'nope'; known presets: .*embedded"):
        load_config("nope")


def test_yaml_path_and_round_trip(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("engine:\n  backend: transformers\n")
    config = load_config(str(path))
    assert config.engine.backend == "transformers"
    out = tmp_path / "resolved.yaml"
    dump_config(config, out)
    assert RunConfig.model_validate(yaml.safe_load(out.read_text())) == config


def test_enforced_turn_must_fit_in_max_new_tokens():
    # 398 + 98 + 64 tag characters = 560 characters, about 140 tokens: the embedded 256 fits, 100 does not
    with pytest.raises(ConfigError, match=r"max_new_tokens=100 cannot hold the longest turn.*140 tokens"):
        load_config("embedded", ["agent.max_new_tokens=100"])
    assert (
        load_config("embedded", ["agent.max_new_tokens=100", "agent.enforce_think_chars=150"]).agent.max_new_tokens
        == 100
    )
    assert load_config("embedded", ["agent.max_new_tokens=100", "agent.enforcement=none"]).agent.enforcement == "none"


def test_a_preset_extends_another_with_only_what_differs(tmp_path):
    untuned = load_config("embedded-untuned")
    assert untuned.engine.adapter is None and untuned.name == "embedded-untuned"
    embedded = load_config("embedded")
    assert untuned.model_dump(exclude={"name", "engine"}) == embedded.model_dump(exclude={"name", "engine"})
    assert untuned.engine.model_dump(exclude={"adapter"}) == embedded.engine.model_dump(exclude={"adapter"})
    mine = tmp_path / "mine.yaml"
    mine.write_text("extends: embedded\nagent:\n  max_turns: 2\n")
    config = load_config(str(mine))
    assert config.agent.max_turns == 2 and config.agent.protocol == embedded.agent.protocol  # a section overlaid


def test_a_preset_cycle_is_refused(tmp_path):
    (tmp_path / "a.yaml").write_text(f"extends: {tmp_path / 'b.yaml'}\n")
    (tmp_path / "b.yaml").write_text(f"extends: {tmp_path / 'a.yaml'}\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(str(tmp_path / "a.yaml"))


def test_the_config_package_exports_every_section_name():
    """``raypipe.core.config`` is a package of one module per section; every public name defined in one of them is
    imported from the package itself, as it was from the one module it replaced."""
    import importlib
    import pkgutil
    import types

    import raypipe.core.config as package

    assert {m.name for m in pkgutil.iter_modules(package.__path__)} >= {"agent", "retrieval", "run", "load"}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        defined = {
            name
            for name, value in vars(module).items()
            if not name.startswith("_")
            and not isinstance(value, types.ModuleType)
            and getattr(value, "__module__", module.__name__) == module.__name__
        } - {"annotations", "fill_missing"}  # the __future__ flag; the validators' own helper
        assert defined <= set(package.__all__), f"{info.name}: {sorted(defined - set(package.__all__))}"
        assert all(getattr(package, name) is getattr(module, name) for name in defined)
