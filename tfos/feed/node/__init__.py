"""The feed's TF-process side: the hub that receives Arrow frames (``hub``), ``DataFeed``
(``datafeed``), ``TFManager`` (``manager``). Never imports driver modules."""
