"""FFmpeg completeness for torchcodec, from real `ldconfig -p` lines, and disk space."""

import os

from ansible_collections.ddtree.sglang.plugins.module_utils import host_checks

DEBIAN12_FFMPEG = (
    "1234 libs found in cache `/etc/ld.so.cache'\n"
    "\tlibswscale.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libswscale.so.6\n"
    "\tlibswresample.so.4 (libc6,x86-64) => /lib/x86_64-linux-gnu/libswresample.so.4\n"
    "\tlibavutil.so.57 (libc6,x86-64) => /lib/x86_64-linux-gnu/libavutil.so.57\n"
    "\tlibavformat.so.59 (libc6,x86-64) => /lib/x86_64-linux-gnu/libavformat.so.59\n"
    "\tlibavfilter.so.8 (libc6,x86-64) => /lib/x86_64-linux-gnu/libavfilter.so.8\n"
    "\tlibavdevice.so.59 (libc6,x86-64) => /lib/x86_64-linux-gnu/libavdevice.so.59\n"
    "\tlibavcodec.so.59 (libc6,x86-64) => /lib/x86_64-linux-gnu/libavcodec.so.59\n"
    "\tlibavahi-client.so.3 (libc6,x86-64) => /lib/x86_64-linux-gnu/libavahi-client.so.3\n"
    "\tlibc.so.6 (libc6,x86-64, OS ABI: Linux 3.2.0) => /lib/x86_64-linux-gnu/libc.so.6\n"
)


def test_debian12_has_complete_ffmpeg5():
    sonames = host_checks.ffmpeg_sonames(DEBIAN12_FFMPEG)
    assert sonames == {
        "libavcodec": [59],
        "libavdevice": [59],
        "libavfilter": [8],
        "libavformat": [59],
        "libavutil": [57],
        "libswresample": [4],
        "libswscale": [6],
    }
    releases = host_checks.ffmpeg_releases(sonames)
    assert releases["complete"] == ["5"]
    assert releases["closest"] is None
    assert "libavutil.so.56" in releases["missing"]["4"]


def test_one_missing_library_names_it():
    text = "\n".join(line for line in DEBIAN12_FFMPEG.splitlines() if "libswscale" not in line)
    releases = host_checks.ffmpeg_releases(host_checks.ffmpeg_sonames(text))
    assert releases["complete"] == []
    assert releases["closest"] == {"release": "5", "missing": ["libswscale.so.6"]}


def test_no_ffmpeg_at_all():
    releases = host_checks.ffmpeg_releases(host_checks.ffmpeg_sonames("\tlibc.so.6 (libc6,x86-64) => /lib/libc.so.6\n"))
    assert releases["complete"] == []
    assert releases["closest"] is None
    assert len(releases["missing"]) == len(host_checks.FFMPEG_SONAMES)


def test_two_releases_side_by_side():
    text = DEBIAN12_FFMPEG + "".join(
        "\t%s.so.%d (libc6,x86-64) => /opt/ffmpeg7/%s.so.%d\n" % (name, major, name, major)
        for name, major in host_checks.FFMPEG_SONAMES["7"].items()
    )
    assert host_checks.ffmpeg_releases(host_checks.ffmpeg_sonames(text))["complete"] == ["5", "7"]


def test_disk_space_measures_closest_existing_parent(tmp_path):
    result = host_checks.disk_space(str(tmp_path / "not" / "yet"))
    assert result["checked_path"] == str(tmp_path)
    stat = os.statvfs(str(tmp_path))
    assert result["free_mib"] == stat.f_bavail * stat.f_frsize // (1024 * 1024)
    assert 0 < result["free_mib"] <= result["total_mib"]
