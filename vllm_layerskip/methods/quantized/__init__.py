from vllm_layerskip.methods.quantized.options import QuantizedOptions
from vllm_layerskip.methods.registry import MethodSpec

METHOD = MethodSpec(
    name="quantized",
    options=QuantizedOptions,
    proposer="vllm_layerskip.methods.quantized.proposer.QuantizedProposer",
)
