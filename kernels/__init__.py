"""Triton kernels of vllm-layerskip (GPU), each with a torch reference used where
Triton cannot run."""
