"""One module per job: its driver, its Ray adapter (Data UDF, Train loop, Tune trial) and its ``main()``."""
