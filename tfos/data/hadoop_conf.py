"""This host's Hadoop configuration, read without Hadoop (every process): the core-site.xml
properties and the default filesystem. Below both :mod:`tfos.data.fs` and :mod:`tfos.data.hdfs`,
which read it."""

from __future__ import annotations

import os


def site_properties(xml_text: str) -> dict[str, str]:
    """Pure: the properties of a Hadoop ``*-site.xml`` text ({} if it is not valid XML)."""
    import xml.etree.ElementTree as ET

    try:
        root = ET.fromstring(xml_text)
    except ET.ParseError:
        return {}
    found = {}
    for prop in root.iter("property"):
        name, value = prop.findtext("name"), prop.findtext("value")
        if name and value:
            found[name.strip()] = value.strip()
    return found


def default_fs_of(core: dict[str, str]) -> str | None:
    """Pure: ``fs.defaultFS`` (or its old name ``fs.default.name``) of core-site properties."""
    return core.get("fs.defaultFS") or core.get("fs.default.name")


def core_site_default_fs(xml_text: str) -> str | None:
    """Pure: ``fs.defaultFS`` from a core-site.xml text; None if it sets none or is not valid XML."""
    return default_fs_of(site_properties(xml_text))


def hadoop_core_site(environ=os.environ, read=None) -> dict[str, str]:
    """This host's core-site.xml properties: ``$HADOOP_CONF_DIR``, then ``$HADOOP_HOME/etc/hadoop``
    (the first that holds one); {} without one."""
    def read_file(path):
        with open(path, encoding="utf-8") as f:
            return f.read(1 << 20)

    read = read or read_file
    dirs = [environ.get("HADOOP_CONF_DIR")]
    if environ.get("HADOOP_HOME"):
        dirs.append(os.path.join(environ["HADOOP_HOME"], "etc", "hadoop"))
    for d in filter(None, dirs):
        try:
            return site_properties(read(os.path.join(d, "core-site.xml")))
        except OSError:
            continue
    return {}


def hadoop_default_fs(environ=os.environ, read=None) -> str:
    """The Hadoop default filesystem as this host's Hadoop configuration gives it: core-site.xml in
    ``$HADOOP_CONF_DIR``, then ``$HADOOP_HOME/etc/hadoop``; ``file:///`` without one. A Spark
    Connect client cannot ask the driver JVM, so tfos's barrier tasks ask their executor host."""
    return default_fs_of(hadoop_core_site(environ, read)) or "file:///"
