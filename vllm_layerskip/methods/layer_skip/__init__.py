from vllm_layerskip.methods.layer_skip.options import LayerSkipOptions
from vllm_layerskip.methods.registry import MethodSpec

METHOD = MethodSpec(
    name="layer_skip",
    options=LayerSkipOptions,
    proposer="vllm_layerskip.methods.layer_skip.proposer.LayerSkipProposer",
)
