"""latch-check's registrations with Latch (entry point group latch.plugins).

Commands (latch_check.commands, which imports no torch): ``compile`` (the whole pipeline on an
example, run on the GPU or the arena simulator; latch_check.pipeline), ``check`` (captured program
vs eager PyTorch, FP64; latch_check.compare), ``simulate`` (schedule + memory plan on the CPU arena
simulator vs the FP64 interpreter; latch_check.simulator), ``bench`` (the generated program against
PyTorch's controls on the GPU; latch_check.bench), ``bench-attention``, ``bench-lmhead``,
``bench-matmul``, ``bench-memory``, ``bench-moe`` (one op class inside the kernel against its torch control).
"""

from latch_core.hookspecs import hookimpl


@hookimpl
def latch_register_commands(register):
    from .bench import bench_command
    from .bench_attention import bench_attention_command
    from .bench_lmhead import bench_lmhead_command
    from .bench_matmul import bench_matmul_command
    from .bench_memory import bench_memory_command
    from .bench_moe import bench_moe_command
    from .commands import check_command, compile_command, simulate_command

    for command in (bench_command, bench_attention_command, bench_lmhead_command, bench_matmul_command,
                    bench_memory_command, bench_moe_command, check_command, compile_command, simulate_command):
        register(command)
