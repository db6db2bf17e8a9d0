"""``python -m migrate`` runs the ``ampmigrate`` command line."""

from migrate.entry import run

if __name__ == "__main__":
    run(prog_name="ampmigrate")
