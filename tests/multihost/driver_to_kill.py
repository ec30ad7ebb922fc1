"""The main_fun of the fed clusters the fault matrix cuts off (test_faults.py) or whose driver it
SIGKILLs (secured_app.py's last cluster, test_outsiders.py): it reads the feed slowly until told
to stop, reporting the rows read."""


def slow_reader(args, ctx):
    import time

    feed = ctx.get_data_feed()
    while not feed.should_stop():
        feed.next_batch(50)
        ctx.report(rows=feed.rows_read)
        time.sleep(0.02)
