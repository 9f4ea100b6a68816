//! `usermm report` end to end: a results folder from two brief
//! experiments, the page `usermm bench` writes from it, and, where a
//! headless Chromium is installed, the page loaded in it: a screenshot is
//! taken and must show a page, and the page's own count of what the
//! browser laid out must name every section and every plot.
//!
//! Without a browser the test checks the page's text only and says so;
//! with `USERMM_REQUIRE_BROWSER=1` a missing browser fails it.

use std::path::{Path, PathBuf};
use std::process::Command;

fn usermm(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_usermm"))
        .args(args)
        .output()
        .expect("run usermm");
    assert!(
        out.status.success(),
        "usermm {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn browser() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome", "chrome"]
        .iter()
        .flat_map(|b| std::env::split_paths(&path).map(move |d| d.join(b)))
        .find(|p| p.is_file())
}

fn chromium(b: &Path, dir: &Path, args: &[&str]) -> std::process::Output {
    let page = format!("file://{}", dir.join("index.html").display());
    Command::new(b)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1280,8000",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .args(args)
        .arg(page)
        .output()
        .expect("run the browser")
}

#[test]
fn the_report_holds_every_experiment_and_renders() {
    let dir = std::env::temp_dir().join(format!("usermm-report-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_str().expect("a UTF-8 temp path");
    let out = usermm(&[
        "bench",
        "munmap",
        "--runs",
        "1",
        "--size-mb",
        "8",
        "--sizes",
        "4,64",
        "--no-host",
        "--out",
        d,
    ]);
    let page = dir.join("index.html");
    assert!(
        out.contains(&format!("report: {}", page.display())),
        "bench ends by naming the page: {out}"
    );
    usermm(&[
        "bench",
        "access",
        "--runs",
        "1",
        "--size-mb",
        "16",
        "--out",
        d,
    ]);
    let out = usermm(&["report", "--out", d]);
    assert!(out.contains("index.html"), "{out}");
    let html = std::fs::read_to_string(&page).expect("the page");
    // The summary opens the page: a line for access (munmap's needs the
    // 2 MiB row this brief run left out), also in summary.json.
    let summary: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("summary.json")).expect("summary.json"),
    )
    .expect("summary.json is JSON");
    let named: Vec<&str> = summary
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|l| l["experiment"].as_str())
        .collect();
    assert_eq!(named, ["access"], "{summary}");
    assert!(
        html.find("<section id=\"summary\">") < html.find("<section id=\"run\">"),
        "the summary comes first"
    );
    for id in ["summary", "run", "munmap", "access", "page-tables"] {
        assert!(
            html.contains(&format!("<section id=\"{id}\">")),
            "section {id}"
        );
    }
    assert!(html.contains("bench munmap"), "the command is on the page");
    assert!(html.contains("Linux "), "the host kernel is on the page");
    let sections = html.matches("<section ").count();
    let plots = html.matches("<svg").count();
    assert!(plots >= 3, "munmap's, access's and the page tables' plots");

    let Some(b) = browser() else {
        assert!(
            std::env::var_os("USERMM_REQUIRE_BROWSER").is_none(),
            "no headless Chromium found"
        );
        eprintln!("no headless Chromium: the page's rendering was not checked");
        let _ = std::fs::remove_dir_all(&dir);
        return;
    };
    let shot = dir.join("report.png");
    let o = chromium(&b, &dir, &[&format!("--screenshot={}", shot.display())]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let img = image_stats(&shot);
    assert!(
        img.colours > 16 && img.ink > 0.01,
        "the screenshot shows a page: {img:?}"
    );
    let o = chromium(&b, &dir, &["--dump-dom"]);
    let dom = String::from_utf8_lossy(&o.stdout);
    let want = format!("data-rendered=\"sections={sections} plots={plots} empty=0\"");
    assert!(
        dom.contains(&want),
        "every section and plot laid out ({want}); the page says: {:?}",
        dom.find("data-rendered")
            .map(|i| &dom[i..(i + 60).min(dom.len())])
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[derive(Debug)]
struct ImageStats {
    /// Distinct colours (up to a cap).
    colours: usize,
    /// The share of pixels that are not white.
    ink: f64,
}

fn image_stats(p: &Path) -> ImageStats {
    let f = std::fs::File::open(p).expect("the screenshot");
    let mut r = png::Decoder::new(std::io::BufReader::new(f))
        .read_info()
        .expect("a PNG");
    let mut buf = vec![0; r.output_buffer_size()];
    let info = r.next_frame(&mut buf).expect("a frame");
    let px = info.color_type.samples();
    let mut colours = std::collections::HashSet::new();
    let (mut ink, mut n) = (0usize, 0usize);
    for c in buf[..info.buffer_size()].chunks(px) {
        n += 1;
        if c.iter().take(3).any(|&v| v < 250) {
            ink += 1;
        }
        if colours.len() < 1000 {
            colours.insert(c.to_vec());
        }
    }
    ImageStats {
        colours: colours.len(),
        ink: ink as f64 / n.max(1) as f64,
    }
}
