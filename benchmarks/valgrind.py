"""What the benchmarks that count instructions under valgrind share.

    from valgrind import tolerate_rlimits   # after putting benchmarks/ on sys.path

mlx-lm raises the open-file limit when it is imported; under valgrind the hard limit is lower,
so that call fails. `tolerate_rlimits()` (called before MLX is imported) lets it fail quietly.
"""

import resource


def tolerate_rlimits() -> None:
    set_limit = resource.setrlimit

    def tolerant(*args):
        try:
            set_limit(*args)
        except ValueError:
            pass

    resource.setrlimit = tolerant
