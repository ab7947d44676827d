# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Host facts other than GPUs that a service needs: FFmpeg for torchcodec, free disk."""

from __future__ import annotations

import os
import re

# torchcodec loads all seven FFmpeg libraries of one FFmpeg release; these are their sonames per
# release (FFmpeg's own version tables). Debian 12 ships FFmpeg 5.1.
FFMPEG_SONAMES = {
    "4": {
        "libavutil": 56,
        "libavcodec": 58,
        "libavformat": 58,
        "libavdevice": 58,
        "libavfilter": 7,
        "libswscale": 5,
        "libswresample": 3,
    },
    "5": {
        "libavutil": 57,
        "libavcodec": 59,
        "libavformat": 59,
        "libavdevice": 59,
        "libavfilter": 8,
        "libswscale": 6,
        "libswresample": 4,
    },
    "6": {
        "libavutil": 58,
        "libavcodec": 60,
        "libavformat": 60,
        "libavdevice": 60,
        "libavfilter": 9,
        "libswscale": 7,
        "libswresample": 4,
    },
    "7": {
        "libavutil": 59,
        "libavcodec": 61,
        "libavformat": 61,
        "libavdevice": 61,
        "libavfilter": 10,
        "libswscale": 8,
        "libswresample": 5,
    },
    "8": {
        "libavutil": 60,
        "libavcodec": 62,
        "libavformat": 62,
        "libavdevice": 62,
        "libavfilter": 11,
        "libswscale": 9,
        "libswresample": 6,
    },
}
FFMPEG_LIBRARIES = (
    "libavutil",
    "libavcodec",
    "libavformat",
    "libavdevice",
    "libavfilter",
    "libswscale",
    "libswresample",
)

_LDCONFIG_LINE = re.compile(r"^\s*(lib(?:av\w+|sw\w+))\.so\.(\d+)\s")


def ffmpeg_sonames(ldconfig_output):
    """{'libavcodec': [59], ...} from `ldconfig -p` output: the FFmpeg sonames the loader can find."""
    found = {}
    for line in ldconfig_output.splitlines():
        match = _LDCONFIG_LINE.match(line)
        if match and match.group(1) in FFMPEG_LIBRARIES:
            majors = found.setdefault(match.group(1), [])
            if int(match.group(2)) not in majors:
                majors.append(int(match.group(2)))
    return {name: sorted(majors) for name, majors in sorted(found.items())}


def ffmpeg_releases(sonames):
    """Which FFmpeg releases are complete, and what each one lacks.

    Returns {'complete': ['5'], 'missing': {'4': ['libavutil.so.56', ...], ...}, 'closest': {...}}, where
    'closest' is the incomplete release lacking the fewest libraries (None when one is complete or
    no FFmpeg library is present at all), for an error message that says what to install.
    """
    complete, missing = [], {}
    for release, wanted in FFMPEG_SONAMES.items():
        lacking = ["%s.so.%d" % (name, major) for name, major in wanted.items() if major not in sonames.get(name, [])]
        if lacking:
            missing[release] = lacking
        else:
            complete.append(release)
    closest = None
    partial = [(len(lacking), release) for release, lacking in missing.items() if len(lacking) < len(FFMPEG_LIBRARIES)]
    if not complete and partial:
        release = min(partial)[1]
        closest = {"release": release, "missing": missing[release]}
    return {"complete": complete, "missing": missing, "closest": closest}


def nearest_existing_path(path):
    """The path itself or its closest existing ancestor (a service root may not exist yet)."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def disk_space(path, statvfs=os.statvfs):
    checked = nearest_existing_path(path)
    stat = statvfs(checked)
    return {
        "path": path,
        "checked_path": checked,
        "free_mib": stat.f_bavail * stat.f_frsize // (1024 * 1024),
        "total_mib": stat.f_blocks * stat.f_frsize // (1024 * 1024),
    }
