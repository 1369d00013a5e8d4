"""The ordered list of algorithms that everything else iterates."""

from typing import Dict, Tuple

from tf_tpu_embed_opt.definitions.algorithms import (
    adadelta,
    adagrad,
    adagrad_momentum,
    adam,
    centered_rms_prop,
    ftrl,
    momentum,
    proximal_adagrad,
    proximal_yogi,
    rms_prop,
    sgd,
)
from tf_tpu_embed_opt.definitions.spec import Definition

DEFINITIONS: Tuple[Definition, ...] = (
    sgd.DEFINITION,
    adagrad.DEFINITION,
    adagrad_momentum.DEFINITION,
    adam.DEFINITION,
    ftrl.DEFINITION,
    momentum.DEFINITION,
    rms_prop.DEFINITION,
    centered_rms_prop.DEFINITION,
    adadelta.DEFINITION,
    proximal_adagrad.DEFINITION,
    proximal_yogi.DEFINITION,
)

BY_NAME: Dict[str, Definition] = {d.name: d for d in DEFINITIONS}
BY_PROTO_ONEOF: Dict[str, Definition] = {d.proto_oneof: d for d in DEFINITIONS}
