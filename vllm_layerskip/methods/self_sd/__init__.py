from vllm_layerskip.methods.self_sd.options import SelfSdOptions
from vllm_layerskip.methods.registry import MethodSpec

METHOD = MethodSpec(
    name="self_sd",
    options=SelfSdOptions,
    proposer="vllm_layerskip.methods.self_sd.proposer.SelfSdProposer",
)
