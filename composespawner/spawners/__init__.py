"""JupyterHub glue: the composing spawners, their form and their refusals."""
