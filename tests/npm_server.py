"""The npm filesystem MCP server, installed for the tests where npm is on the machine."""

import shutil
import subprocess
from pathlib import Path

HAS_NPM = shutil.which("npm") is not None


def install_filesystem_server(folder: Path) -> Path:
    """Install @modelcontextprotocol/server-filesystem into `folder`; its command."""
    # npm install reaches the npm registry alone (npx would look for updates too).
    subprocess.run(["npm", "install", "--prefix", str(folder), "--no-audit", "--no-fund", "--loglevel=error",
                    "@modelcontextprotocol/server-filesystem"], check=True, timeout=600, capture_output=True)
    return folder / "node_modules" / ".bin" / "mcp-server-filesystem"
