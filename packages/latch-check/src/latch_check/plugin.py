"""latch-check's registrations with Latch (entry point group latch.plugins).

Commands (latch_check.commands, which imports no torch): ``compile`` (the whole pipeline on an
example, run on the GPU or the arena simulator; latch_check.pipeline), ``check`` (captured program
vs eager PyTorch, FP64; latch_check.compare), ``simulate`` (schedule + memory plan on the CPU arena
simulator vs the FP64 interpreter; latch_check.simulator), ``bench`` (the generated program against
PyTorch's controls on the GPU; latch_check.bench), ``bench-matmul``.
"""

from latch_core.hookspecs import hookimpl


@hookimpl
def latch_register_commands(register):
    from .bench_lmhead import bench_lmhead_command
    from .bench_attention import bench_attention_command
    from .bench_matmul import bench_matmul_command
    from .bench_moe import bench_moe_command
    from .commands import check_command, compile_command, simulate_command

    register(bench_lmhead_command)
    from .bench import bench_command
    register(bench_command)
    register(bench_attention_command)
    register(bench_matmul_command)
    register(bench_moe_command)
    register(check_command)
    register(compile_command)
    register(simulate_command)
