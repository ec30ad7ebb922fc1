"""run_script with a TF_CONFIG too long for exec (thousands of hosts): the script still gets it,
and its argv, sys.path and __main__ as ``python script argv`` gives them (a real child process)."""

import json
import os
from types import SimpleNamespace

import pytest

from tfos.cluster.node import script_process as sp
from tfos.cluster.node.script_process import Script, needs_file, run_script, script_command

PROBE = b"""
import json, os, sys
import sibling
print("PROBE " + json.dumps({"n": len(os.environ["TF_CONFIG"]), "argv": sys.argv[1:], "name": __name__,
                             "first": json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"][0],
                             "sibling": sibling.VALUE}))
"""


@pytest.mark.parametrize("value_len,expect", [(10, False), (sp.ENV_STRING_MAX - 10, False),
                                              (sp.ENV_STRING_MAX - 9, True), (300_000, True)])
def test_needs_file_at_execs_limit(value_len, expect):
    assert needs_file("TF_CONFIG", "x" * value_len) is expect  # "TF_CONFIG=" is 10 bytes


def test_script_command_through_the_launcher_with_a_file():
    assert script_command("/py", "/d/s.py", ["--a", 1]) == ["/py", "-u", "/d/s.py", "--a", "1"]
    assert script_command("/py", "/d/s.py", ["--a", 1], "/d/tf.json") == \
        ["/py", "-u", "-c", sp.LAUNCHER, "/d/tf.json", "/d/s.py", "--a", "1"]


@pytest.mark.parametrize("hosts", [2, 4000])
def test_run_script_gets_tf_config_of_any_size(tmp_path, monkeypatch, capsys, hosts):
    workers = [f"fakehost-{i:05d}.a-long-domain-name.example:2222" for i in range(hosts)]
    config = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": 0}})
    assert needs_file("TF_CONFIG", config) is (hosts > 2)
    monkeypatch.setenv("TF_CONFIG", config)
    ctx = SimpleNamespace(node_dir=str(tmp_path / "node"), working_dir=str(tmp_path), node_index=0,
                          job_name="worker", task_index=0)
    os.makedirs(ctx.node_dir)
    run_script(Script("probe.py", PROBE, ("--epochs", 2), (("sibling.py", b"VALUE = 7\n"),)), ctx)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("PROBE "))
    seen = json.loads(line[len("PROBE "):])
    assert seen == {"n": len(config), "argv": ["--epochs", "2"], "name": "__main__", "first": workers[0],
                    "sibling": 7}
