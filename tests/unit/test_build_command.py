"""The one ``build|path`` command of tfos's compiled parts (tfos.host.builds.command), which
``python -m tfos.tunnel``, ``tfos.tf.gloo_kernel`` and ``tfos.data.tfhdfs`` (and so ``tfos build``)
each run."""

import logging

import pytest

from tfos.data import tfhdfs
from tfos.errors import TFOSError
from tfos.host.builds import command
from tfos.tf import gloo_kernel
from tfos.tunnel import build as tunnel_build


def _raise():
    raise TFOSError("cargo is needed: install Rust")


@pytest.mark.parametrize("argv,build,where,code,out,logged", [
    (["build"], lambda: ["/c/a", "/c/b"], None, 0, "/c/a\n/c/b\n", ""),
    (["build"], lambda: "/c/lib.so", None, 0, "/c/lib.so\n", ""),
    (["path"], None, lambda: ("/c/a",), 0, "/c/a\n", ""),
    (["path"], None, lambda: None, 1, "", "the part is not built here: run 'prog build'"),
    (["build"], _raise, None, 1, "", "cargo is needed: install Rust"),
])
def test_build_and_path(capsys, caplog, argv, build, where, code, out, logged):
    main = command("prog", "a part", build or (lambda: pytest.fail("build ran")),
                   where or (lambda: pytest.fail("where ran")), "the part")
    with caplog.at_level(logging.ERROR):
        assert main(argv) == code
    assert capsys.readouterr().out == out
    assert logged in caplog.text


def test_a_bad_command_is_a_usage_error():
    with pytest.raises(SystemExit) as e:
        command("prog", "a part", lambda: "x", lambda: "x", "the part")(["make"])
    assert e.value.code == 2


def test_each_part_uses_it(capsys):
    for module in (tunnel_build, gloo_kernel, tfhdfs):
        assert module.main.__qualname__ == "command.<locals>.main", module
    with pytest.raises(SystemExit):
        tunnel_build.main(["--help"])
    assert "python -m tfos.tunnel" in capsys.readouterr().out
