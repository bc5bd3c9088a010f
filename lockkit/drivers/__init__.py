"""Built-in drivers, one module per backend. Import nothing here: drivers load lazily by scheme."""
