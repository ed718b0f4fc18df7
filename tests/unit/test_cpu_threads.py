"""Every core to vLLM's CPU worker on a small machine (tools/cpu_threads.py)."""

from vllm_layerskip.tools.cpu_threads import bind_every_core


def test_a_two_core_machine_binds_the_worker_to_both_cores():
    env = {}
    assert bind_every_core(env, cores={0, 1}) == "0,1"
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": "0,1"}


def test_the_cores_this_process_may_use_not_the_first_n():
    env = {}
    assert bind_every_core(env, cores={5, 4, 7}) == "4,5,7"


def test_a_binding_the_user_set_is_kept():
    env = {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    assert bind_every_core(env, cores={0, 1}) == "nobind"
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def test_a_larger_machine_keeps_vllms_automatic_binding():
    env = {}
    assert bind_every_core(env, cores=set(range(16))) is None
    assert env == {}
