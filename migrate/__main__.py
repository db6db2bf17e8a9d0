"""``python -m migrate`` runs the ``ampmigrate`` command line."""

from migrate.cli import main

if __name__ == "__main__":
    main(prog_name="ampmigrate")
