"""What every layer shares: typed config, table schemas, run directories, model locations, answer metrics."""
