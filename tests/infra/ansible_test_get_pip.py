"""Local stand-in for get-pip.py, which ansible-test downloads from ci-files.testing.ansible.com (not reachable here).

ansible-test runs it as `python get_pip.py --disable-pip-version-check pip==X [setuptools==Y wheel==Z] [--no-setuptools] [--no-wheel]`
inside an empty venv. Like get-pip, this installs exactly the pinned packages from PyPI: ensurepip bootstraps the pip
bundled with this Python (in a child process: ensurepip empties pip's configuration in the environment of the process
it runs in, and the machine's pip configuration carries the CA bundle PyPI is reached with), which then installs the pinned ones.
"""
import subprocess
import sys

args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
code = subprocess.call([sys.executable, "-m", "ensurepip", "--default-pip"])
if code == 0:
    code = subprocess.call([sys.executable, "-m", "pip", "install", "--upgrade", *args])
if code == 0 and "--no-setuptools" in sys.argv and not any(a.startswith("setuptools") for a in args):
    # Python 3.11's ensurepip also installs setuptools; get-pip --no-setuptools would not have.
    code = subprocess.call([sys.executable, "-m", "pip", "uninstall", "--yes", "--quiet", "setuptools"])
sys.exit(code)
