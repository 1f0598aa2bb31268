"""Typed run configuration: YAML presets under ``raypipe/presets/``, overridable from the command line.

A run is described by one :class:`RunConfig`. Presets are YAML files (``raypipe/presets/<name>.yaml``) or any
YAML path; ``--set section.key=value`` overrides single values (the value is parsed as YAML). Unknown
keys and bad values fail with a message that names the key. Every run writes the resolved config next
to its outputs (``RUN_DIR/config.yaml``).

One module per section (``agent``, ``retrieval``, ...), the whole :class:`RunConfig` in ``run`` and the
loading in ``load``; every public name is imported from here.
"""

from raypipe.core.config.agent import (
    CHARS_PER_TOKEN,
    ENFORCED_TAG_CHARS,
    PROTOCOL_DEFAULTS,
    AgentConfig,
    ProtocolDefaults,
)
from raypipe.core.config.agent_train import AgentTrainConfig
from raypipe.core.config.base import (
    PAPER_F1_SHARE,
    PAPER_ITERATIONS_CHANGE,
    PAPER_THETA_P,
    PAPER_THETA_U,
    PAPER_THETA_U_STRICT,
    SEED_HEAD_HIDDEN,
    SEED_HEAD_LEARNING_RATE,
    SEED_HEAD_WEIGHT_DECAY,
    ConfigError,
    ReasoningText,
    StrictModel,
    nested_section,
)
from raypipe.core.config.cluster import RayConfig
from raypipe.core.config.data import DataConfig
from raypipe.core.config.engine import EngineConfig
from raypipe.core.config.features import FeaturesConfig
from raypipe.core.config.generation import GenerationConfig
from raypipe.core.config.load import (
    DEFAULT_PRESET,
    PRESET_DIR,
    apply_override,
    dump_config,
    known_presets,
    load_config,
    preset_path,
    preset_tree,
)
from raypipe.core.config.migrate import MOVED_KEYS, migrate_key, migrate_tree
from raypipe.core.config.report import Correction, ReportConfig
from raypipe.core.config.retrieval import (
    ActorsConfig,
    EncodeConfig,
    HttpConfig,
    IndexConfig,
    RetrievalConfig,
    ServeConfig,
)
from raypipe.core.config.run import RunConfig
from raypipe.core.config.serve_agent import ServeAgentConfig
from raypipe.core.config.stopping import ControllerBackend, HeadRefit, HeuristicVariant, StoppingConfig
from raypipe.core.config.stoprag import StopRagConfig
from raypipe.core.config.tracking import TrackingConfig
from raypipe.core.config.train import Relation, TrainConfig

__all__ = [
    "ActorsConfig",
    "AgentConfig",
    "AgentTrainConfig",
    "CHARS_PER_TOKEN",
    "ConfigError",
    "ControllerBackend",
    "Correction",
    "DEFAULT_PRESET",
    "DataConfig",
    "ENFORCED_TAG_CHARS",
    "EncodeConfig",
    "EngineConfig",
    "FeaturesConfig",
    "GenerationConfig",
    "HeadRefit",
    "HeuristicVariant",
    "HttpConfig",
    "IndexConfig",
    "MOVED_KEYS",
    "PAPER_F1_SHARE",
    "PAPER_ITERATIONS_CHANGE",
    "PAPER_THETA_P",
    "PAPER_THETA_U",
    "PAPER_THETA_U_STRICT",
    "PRESET_DIR",
    "PROTOCOL_DEFAULTS",
    "ProtocolDefaults",
    "RayConfig",
    "ReasoningText",
    "Relation",
    "ReportConfig",
    "RetrievalConfig",
    "RunConfig",
    "SEED_HEAD_HIDDEN",
    "SEED_HEAD_LEARNING_RATE",
    "SEED_HEAD_WEIGHT_DECAY",
    "ServeAgentConfig",
    "ServeConfig",
    "StopRagConfig",
    "StoppingConfig",
    "StrictModel",
    "TrackingConfig",
    "TrainConfig",
    "apply_override",
    "dump_config",
    "known_presets",
    "load_config",
    "migrate_key",
    "migrate_tree",
    "nested_section",
    "preset_path",
    "preset_tree",
]
