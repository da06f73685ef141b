from hicachectl.cli import app

app(prog_name="hicachectl")
