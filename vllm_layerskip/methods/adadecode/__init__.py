from vllm_layerskip.methods.adadecode.options import AdaDecodeOptions
from vllm_layerskip.methods.registry import MethodSpec

METHOD = MethodSpec(
    name="adadecode",
    options=AdaDecodeOptions,
    proposer="vllm_layerskip.methods.adadecode.proposer.AdaDecodeProposer",
)
