"""tfos doctor's judgement, from tables (pure): each problem in an executor's or the driver's report
is one finding with its status and fix; a healthy cluster has no failure."""

import copy

import pytest

from tfos.cluster.driver.doctor import FAIL, OK, WARN, expected_executors, judge, table

VERSIONS = {"python": "3.11.7", "python_path": "/v/bin/python", "tfos": "0.1.0", "tensorflow": "2.21.0",
            "pyarrow": "20.0.0", "torch": "2.13.0"}
BUILDS = {"tunnel": True, "cargo": True, "hdfs_plugin": True, "gloo_op": True}


def report(host="h1", **changes):
    r = {"host": host, "versions": dict(VERSIONS), "builds": dict(BUILDS),
         "gpus": {"spark": [], "nvidia_smi": 0, "cuda_visible_devices": None}, "reach": "", "java": True,
         "hadoop_conf_dir": ""}
    for path, value in changes.items():
        section, _, key = path.partition("__")
        if key:
            r[section][key] = value
        else:
            r[section] = value
    return r


DRIVER = dict(report("driver"), java_version='openjdk version "17.0.9"')


SECURED = {"spark.authenticate": "true", "spark.network.crypto.enabled": "true"}


def findings(executors, driver=DRIVER, conf=None, environ=None):
    """The doctor's findings, by check; ``conf`` defaults to a Spark that secures its RPC."""
    conf = SECURED if conf is None else conf
    return {f.check: f for f in judge(driver, executors, conf, environ or {}, "10.0.0.1:40000")}


def test_a_healthy_cluster_has_no_failure():
    got = findings([report("h1"), report("h2")], conf=SECURED)
    assert {f.status for f in got.values()} == {OK}, table(list(got.values()))
    defaults = findings([report("h1"), report("h2")], conf={})  # Spark's defaults: one warning, about its RPC
    assert [f.check for f in defaults.values() if f.status != OK] == ["spark rpc"]
    assert "2 task(s) reported from 2 host(s)" in got["executors"].detail


@pytest.mark.parametrize("change,check,status,fix", [
    ({"versions__python": "3.10.12"}, "python", FAIL, "spark.pyspark.python"),
    ({"versions__tfos": "0.0.9"}, "tfos", FAIL, "pip install tfos==0.1.0"),
    ({"versions__tfos": ""}, "tfos", FAIL, "install the same tfos"),
    ({"versions__tensorflow": "2.20.0"}, "tensorflow", FAIL, "same TensorFlow"),
    ({"versions__tensorflow": ""}, "tensorflow", FAIL, "same TensorFlow"),
    ({"versions__pyarrow": "19.0.0"}, "pyarrow", WARN, "same pyarrow"),
    ({"reach": "TimeoutError: timed out"}, "driver address", FAIL, "TFOS_SERVER_HOST"),
    ({"builds__tunnel": False, "builds__cargo": False}, "node tunnel", FAIL, "tfos build tunnel"),
    ({"builds__tunnel": False}, "node tunnel", WARN, "tfos build tunnel"),
    ({"builds__gloo_op": False}, "gloo op", WARN, "tfos build gloo"),
])
def test_each_executor_problem_is_one_finding_with_its_fix(change, check, status, fix):
    got = findings([report("h1"), report("h2", **change)])
    assert got[check].status == status and fix in got[check].fix, got[check]
    assert "h2" in got[check].detail and "h1" not in got[check].detail.split(" on ")[-1]
    others = [f for f in got.values() if f.check != check and f.status != OK]
    assert not others, others


def test_gpus_requested_but_not_given_fail():
    conf = {"spark.task.resource.gpu.amount": "1"}
    assert findings([report("h1", gpus__spark=["0"])], conf=conf)["gpus"].status == OK
    got = findings([report("h1", gpus__spark=["0"]), report("h2")], conf=conf)["gpus"]
    assert got.status == FAIL and "h2" in got.detail and "discoveryScript" in got.fix


def test_hdfs_plugin_matters_only_with_hdfs():
    missing = [report("h1", builds__hdfs_plugin=False)]
    assert findings(missing)["hdfs:// plugin"].status == OK
    got = findings(missing, conf={"spark.hadoop.fs.defaultFS": "hdfs://nn:8020"})["hdfs:// plugin"]
    assert got.status == WARN and "tfos build hdfs" in got.fix


def test_encryption_says_what_tfos_does_with_sparks_settings():
    got = findings([report()], conf={"spark.authenticate": "true"})["encryption"]
    assert got.status == OK and "spark.authenticate" in got.detail and "encrypt=False" in got.detail


@pytest.mark.parametrize("conf,status", [
    ({}, WARN),
    ({"spark.authenticate": "true"}, WARN),
    ({"spark.authenticate": "true", "spark.network.crypto.enabled": "true"}, OK),
])
def test_the_doctor_says_whether_sparks_rpc_keeps_the_secret(conf, status):
    got = findings([report()], conf=conf)["spark rpc"]
    assert got.status == status
    if status == WARN:
        assert "launch messages" in got.detail and got.fix == "spark.authenticate=true with spark.network.crypto.enabled=true"


def test_driver_side_java_hadoop_and_kerberos():
    no_java = dict(DRIVER, java=False)
    assert findings([report()], driver=no_java)["java"].status == FAIL
    env = {"HADOOP_CONF_DIR": "/etc/hadoop/conf"}
    assert findings([report()], driver=dict(DRIVER, hadoop_conf_readable=False), environ=env)["hadoop"].status == FAIL
    krb = dict(DRIVER, hadoop_conf_readable=True, kerberos=True, kerberos_credentials=False)
    assert "kinit" in findings([report()], driver=krb, environ=env)["kerberos"].fix
    ok = dict(krb, kerberos_credentials=True)
    assert findings([report()], driver=ok, environ=env)["hadoop"].status == OK


def test_no_executor_report_is_a_failure():
    assert findings([])["executors"].status == FAIL


def test_table_puts_the_fix_under_the_failing_row():
    text = table(judge(DRIVER, [report("h1", versions__tfos="0.0.9")], {}, {}, "a:1"))
    lines = text.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith("tfos "))
    assert "FAIL" in lines[i] and lines[i + 1].strip().startswith("fix: install the same tfos")


def test_executors_that_cannot_import_tfos_are_one_failure_naming_their_python():
    broken = {"host": "h2", "import_error": "ModuleNotFoundError: No module named 'tfos'",
              "versions": {"python": "3.11.2", "python_path": "/usr/bin/python3"}, "gpus": {"spark": []}}
    got = judge(DRIVER, [report("h1"), broken], {}, {}, "a:1")
    tfos_rows = [f for f in got if f.check == "tfos"]
    assert len(tfos_rows) == 2 and tfos_rows[0].status == FAIL and "/usr/bin/python3" in tfos_rows[0].detail
    assert "PYSPARK_PYTHON" in tfos_rows[0].fix and tfos_rows[1].status == OK  # h1's own tfos is fine
    only = judge(DRIVER, [broken], {}, {}, "a:1")
    assert [f.check for f in only] == ["executors", "tfos"]


def test_the_executors_the_application_asked_for():
    assert expected_executors("local-cluster[3,1,1024]", {}) == 3
    assert expected_executors("yarn", {"spark.executor.instances": "8"}) == 8
    assert expected_executors("spark://m:7077", {}) is None and expected_executors("yarn", {"spark.executor.instances": "x"}) is None
