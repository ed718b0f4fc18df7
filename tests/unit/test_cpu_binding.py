"""The start-up word about vLLM's CPU thread binding (core/cpu_binding.py): when
the worker got fewer cores than it could have, and what to set."""

import logging

import pytest

from vllm_layerskip.core import cpu_binding
from vllm_layerskip.core.cpu_binding import (Cpu, available_cores, binding_message, id_ranges,
                                             worker_cores)


def test_the_cores_vllm_bound_the_worker_to_from_each_openmp_runtimes_variables():
    assert worker_cores({"OMP_PLACES": "{0}", "OMP_NUM_THREADS": "1"}) == [0]
    assert worker_cores({"OMP_PLACES": "{0,1,2}"}) == [0, 1, 2]
    assert worker_cores({"KMP_AFFINITY": "granularity=fine,explicit,proclist=[4,5,7]"}) == [4, 5, 7]
    assert worker_cores({"GOMP_CPU_AFFINITY": "2 3"}) == [2, 3]
    assert worker_cores({"OMP_NUM_THREADS": "2"}) is None  # set by hand, not a binding
    assert worker_cores({}) is None
    assert worker_cores({"OMP_PLACES": "{cores}"}) is None  # a form vLLM does not write


def test_two_cores_with_one_kept_back_warn_with_the_setting_that_fixes_it():
    level, message = binding_message("auto", [0], [0, 1])
    assert level == logging.WARNING
    assert message.startswith("vLLM's CPU worker runs on 1 of the 2 cores it could use (cores 0; "
                              "with VLLM_CPU_OMP_THREADS_BIND unset vLLM keeps 1 back")
    assert "Set VLLM_CPU_OMP_THREADS_BIND=0-1 to give the worker every core" in message
    assert message.endswith("joined by '|'), or VLLM_CPU_NUM_OF_RESERVED_CPU=0.")


def test_every_core_or_a_users_binding_says_nothing():
    assert binding_message("auto", [0, 1], [0, 1]) is None
    assert binding_message("0", [0], [0, 1]) is None  # the user chose one core
    assert binding_message("0-1", [0, 1], [0, 1]) is None
    assert binding_message("nobind", None, [0, 1]) is None
    assert binding_message("auto", None, [0, 1]) is None  # binding unknown
    assert binding_message("auto", [0], [0, 1], reserved="1") is None  # kept back on purpose


@pytest.mark.parametrize("cores,level", [(2, logging.WARNING), (4, logging.WARNING),
                                         (5, logging.INFO), (16, logging.INFO)])
def test_a_warning_where_the_kept_core_is_a_large_share(cores, level):
    result = binding_message("auto", list(range(cores - 1)), list(range(cores)))
    assert result[0] == level
    assert f"runs on {cores - 1} of the {cores} cores" in result[1]
    assert f"VLLM_CPU_OMP_THREADS_BIND=0-{cores - 1} " in result[1]


def test_available_cores_are_one_logical_cpu_per_core_on_the_workers_node():
    # 2 nodes x 2 cores x 2 threads: cpu ids 0-3 on node 0 (cores 0, 1), 4-7 on node 1.
    cpus = [Cpu(id=i, core=i // 2, node=i // 4) for i in range(8)]
    assert available_cores(cpus, used=[1], one_per_core=True) == [1, 3]  # vLLM takes the last of each
    assert available_cores(cpus, used=[5, 7], one_per_core=True) == [5, 7]
    assert available_cores(cpus, used=[1], one_per_core=False) == [0, 1, 2, 3]
    # The worker on node 0 got core 1's CPU only: 1 of 2.
    level, message = binding_message("auto", [1], available_cores(cpus, [1], True))
    assert "1 of the 2 cores" in message and "VLLM_CPU_OMP_THREADS_BIND=1,3 " in message


def test_id_ranges():
    assert id_ranges([0, 1]) == "0-1"
    assert id_ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert id_ranges([3]) == "3"


def test_checked_once_and_only_in_a_worker_process(monkeypatch):
    import multiprocessing

    logged = []
    monkeypatch.setattr(cpu_binding, "_checked", False)
    monkeypatch.setattr(cpu_binding, "_binding_here", lambda environ: (logging.WARNING, "short"))
    monkeypatch.setattr(cpu_binding.logger, "log", lambda level, fmt, *args: logged.append(args))
    assert cpu_binding.check_worker_binding({}) is None  # the test process is no worker
    monkeypatch.setattr(multiprocessing.current_process(), "name", "VllmWorker-0")
    assert cpu_binding.check_worker_binding({}) == (logging.WARNING, "short")
    assert cpu_binding.check_worker_binding({}) is None  # once a process
    assert logged == [("short",)]


def test_a_failing_check_does_not_stop_the_start_up(monkeypatch):
    import multiprocessing

    def broken(environ):
        raise RuntimeError("lscpu missing")

    monkeypatch.setattr(cpu_binding, "_checked", False)
    monkeypatch.setattr(cpu_binding, "_binding_here", broken)
    monkeypatch.setattr(multiprocessing.current_process(), "name", "VllmWorker-0")
    assert cpu_binding.check_worker_binding({}) is None


def test_on_this_machine(monkeypatch):
    """vLLM's own CPU list and the worker's variables as its executor sets them."""
    from vllm.utils.cpu_resource_utils import get_allowed_cpu_list

    ids = sorted(c.id for c in get_allowed_cpu_list())
    result = cpu_binding._binding_here({"OMP_PLACES": "{%d}" % ids[0], "OMP_NUM_THREADS": "1"})
    if len(ids) == 1:
        assert result is None
    else:
        assert result is not None and "runs on 1 of the" in result[1]
    assert cpu_binding._binding_here({"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, ids)),
                                      "OMP_PLACES": "{%s}" % ",".join(map(str, ids))}) is None
