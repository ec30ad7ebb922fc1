"""Cluster lifecycle. Modules are named by the process they run in:

* ``driver`` / ``driver_service``: the Spark driver (public API, control service);
* ``executor``: the Spark barrier task on each executor (launches the agent);
* ``agent``: the node agent process (supervises the TF process);
* ``tf_node``: the TF process (runs ``main_fun``);
* ``decisions``: pure functions used by all of them; ``host``: host-local helpers.
"""
