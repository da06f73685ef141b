from hicachectl.cli.main import app

app(prog_name="hicachectl")
