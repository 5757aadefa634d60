"""The bootstrap admin token file."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

from control_plane.db.session import make_engine, migrate, session_factory
from control_plane.tokens import authenticate, bootstrap_admin


def test_the_admin_token_file_is_private_even_over_a_readable_one(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'cp.db'}"
    migrate(url)
    token_file = tmp_path / "state" / "admin-token"
    token_file.parent.mkdir()
    token_file.write_text("left by a backup restore\n")
    token_file.chmod(0o644)
    with token_file.open() as opened_before:  # by anyone, while it was world-readable

        async def run() -> bool:
            engine = make_engine(url)
            sessions = session_factory(engine)
            created = await bootstrap_admin(sessions, token_file)
            async with sessions() as s:
                principal = await authenticate(s, token_file.read_text().strip())
            await engine.dispose()
            return created and principal is not None and principal.role.name == "ADMIN"

        assert asyncio.run(run())
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert opened_before.read() == "left by a backup restore\n"  # not the token
