//! Real mail servers for the mail tests, from Debian's packages, started
//! unprivileged per test and removed on drop: dovecot (IMAP with STARTTLS
//! and IMAPS, and LMTP for delivery) and an SMTP submission server
//! (python3-aiosmtpd: STARTTLS and implicit TLS, AUTH required) that
//! delivers through dovecot's LMTP. Certificates come from a throwaway CA
//! made with openssl; the tests trust it through the account's CA file.
//! As root, both servers run as `nobody`.

use crate::ports::unused_port;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The mailbox user and password.
pub const USER: &str = "agent";
/// Its password.
pub const PASSWORD: &str = "mail-pass-7e3f";

/// Running servers.
pub struct MailServers {
    dir: tempfile::TempDir,
    children: Vec<Child>,
    /// IMAP with STARTTLS.
    pub imap_port: u16,
    /// IMAPS.
    pub imaps_port: u16,
    /// SMTP submission with STARTTLS.
    pub smtp_port: u16,
    /// SMTPS.
    pub smtps_port: u16,
    /// LMTP (delivery).
    pub lmtp_port: u16,
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn wait_port(port: u16, what: &str, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "{what} did not start: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether the servers can run here (else the reason).
pub fn missing() -> Option<String> {
    if !Path::new("/usr/sbin/dovecot").exists() {
        return Some("dovecot (dovecot-imapd, dovecot-lmtpd)".into());
    }
    let aiosmtpd = Command::new("/usr/bin/python3").args(["-c", "import aiosmtpd"]).output();
    if !aiosmtpd.is_ok_and(|o| o.status.success()) {
        return Some("python3-aiosmtpd".into());
    }
    if !Path::new("/usr/bin/openssl").exists() {
        return Some("openssl".into());
    }
    None
}

const SMTPD: &str = r#"
import sys, ssl, smtplib, time
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword
cert, key, port, tls_port, lmtp_port, user, pw, log = sys.argv[1:]
class Handler:
    async def handle_DATA(self, server, session, envelope):
        with smtplib.LMTP('127.0.0.1', int(lmtp_port)) as l:
            l.sendmail(envelope.mail_from, envelope.rcpt_tos, envelope.original_content)
        with open(log, 'a') as f:
            f.write(' '.join(envelope.rcpt_tos) + '\n')
        return '250 OK queued'
def auth(server, session, envelope, mechanism, auth_data):
    ok = isinstance(auth_data, LoginPassword) and auth_data.login.decode() == user and auth_data.password.decode() == pw
    return AuthResult(success=ok, handled=False)
ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
ctx.load_cert_chain(cert, key)
Controller(Handler(), hostname='127.0.0.1', port=int(port), tls_context=ctx, require_starttls=True,
           authenticator=auth, auth_require_tls=True, server_hostname='localhost').start()
Controller(Handler(), hostname='127.0.0.1', port=int(tls_port), ssl_context=ctx,
           authenticator=auth, auth_require_tls=False, server_hostname='localhost').start()
print('ready', flush=True)
while True:
    time.sleep(3600)
"#;

impl MailServers {
    /// Starts both servers; `None` (after saying why) when they are not
    /// installed and the services are not required.
    pub fn start() -> Option<MailServers> {
        if let Some(what) = missing() {
            assert!(!crate::services_required(), "{what} is required for the mail tests (make test installs it)");
            eprintln!("skipped: {what} is not installed");
            return None;
        }
        let dir = tempfile::Builder::new().prefix("choir-mail-").tempdir().unwrap();
        let d = &dir.path().to_owned();
        let root = rustix::process::geteuid().is_root();
        std::fs::write(
            d.join("ext.cnf"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
        run(Command::new("openssl").current_dir(d).args(["req", "-x509"]).args(ec).args([
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=Choir test CA",
        ]));
        run(Command::new("openssl").current_dir(d).arg("req").args(ec).args([
            "-keyout",
            "key.pem",
            "-out",
            "req.csr",
            "-subj",
            "/CN=localhost",
        ]));
        run(Command::new("openssl").current_dir(d).args([
            "x509",
            "-req",
            "-in",
            "req.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "cert.pem",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ]));
        let (imap_port, imaps_port, smtp_port, smtps_port, lmtp_port) =
            (unused_port(), unused_port(), unused_port(), unused_port(), unused_port());
        for sub in ["run", "state", "home"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        std::fs::write(d.join("passwd"), format!("{USER}:{{PLAIN}}{PASSWORD}::::::\n")).unwrap();
        let (user, group, uid) = if root {
            ("nobody".to_owned(), "nogroup".to_owned(), 65534)
        } else {
            let name =
                String::from_utf8(Command::new("id").arg("-un").output().unwrap().stdout).unwrap().trim().to_owned();
            let group =
                String::from_utf8(Command::new("id").arg("-gn").output().unwrap().stdout).unwrap().trim().to_owned();
            (name, group, rustix::process::geteuid().as_raw())
        };
        let dh =
            if Path::new("/usr/share/dovecot/dh.pem").exists() { "ssl_dh = </usr/share/dovecot/dh.pem" } else { "" };
        let p = d.display();
        let conf = format!(
            "base_dir = {p}/run\nstate_dir = {p}/state\nlog_path = {p}/dovecot.log\nprotocols = imap lmtp\nlisten = 127.0.0.1\n\
             ssl = yes\nssl_cert = <{p}/cert.pem\nssl_key = <{p}/key.pem\n{dh}\nssl_min_protocol = TLSv1.2\n\
             disable_plaintext_auth = yes\nauth_mechanisms = plain login\nauth_username_format = %Ln\n\
             passdb {{\n  driver = passwd-file\n  args = scheme=PLAIN username_format=%n {p}/passwd\n}}\n\
             userdb {{\n  driver = static\n  args = uid={uid} gid={uid} home={p}/home/%n\n}}\n\
             mail_location = maildir:~/Maildir\ndefault_internal_user = {user}\ndefault_internal_group = {group}\n\
             default_login_user = {user}\n\
             service imap-login {{\n  chroot =\n  inet_listener imap {{\n    port = {imap_port}\n  }}\n  inet_listener imaps {{\n    port = {imaps_port}\n    ssl = yes\n  }}\n}}\n\
             service lmtp {{\n  inet_listener lmtp {{\n    address = 127.0.0.1\n    port = {lmtp_port}\n  }}\n}}\n\
             service anvil {{\n  chroot =\n}}\n"
        );
        std::fs::write(d.join("dovecot.conf"), conf).unwrap();
        std::fs::write(d.join("smtpd.py"), SMTPD).unwrap();
        if root {
            run(Command::new("chown").args(["-R", "nobody:nogroup"]).arg(d));
        }
        let spawn = |argv: &[String], log: &str| -> Child {
            let mut cmd = if root {
                let mut c = Command::new("runuser");
                c.args(["-u", "nobody", "--"]).args(argv);
                c
            } else {
                let mut c = Command::new(&argv[0]);
                c.args(&argv[1..]);
                c
            };
            let out = std::fs::File::create(d.join(log)).unwrap();
            std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
            cmd.stdin(Stdio::null()).stdout(out.try_clone().unwrap()).stderr(out).spawn().unwrap()
        };
        let s = |x: &str| x.to_owned();
        let dovecot = spawn(&[s("/usr/sbin/dovecot"), s("-F"), s("-c"), format!("{p}/dovecot.conf")], "dovecot.out");
        let mut servers =
            MailServers { dir, children: vec![dovecot], imap_port, imaps_port, smtp_port, smtps_port, lmtp_port };
        let d = servers.dir.path().to_owned();
        wait_port(lmtp_port, "dovecot", &d.join("dovecot.log"));
        wait_port(imaps_port, "dovecot", &d.join("dovecot.log"));
        let smtpd = spawn(
            &[
                s("/usr/bin/python3"),
                format!("{p}/smtpd.py"),
                format!("{p}/cert.pem"),
                format!("{p}/key.pem"),
                smtp_port.to_string(),
                smtps_port.to_string(),
                lmtp_port.to_string(),
                s(USER),
                s(PASSWORD),
                format!("{p}/delivered.log"),
            ],
            "smtpd.out",
        );
        servers.children.push(smtpd);
        wait_port(smtp_port, "the SMTP server", &d.join("smtpd.out"));
        wait_port(smtps_port, "the SMTP server", &d.join("smtpd.out"));
        Some(servers)
    }

    /// The CA file the accounts trust.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// Messages the SMTP server has delivered so far.
    pub fn delivered(&self) -> usize {
        std::fs::read_to_string(self.dir.path().join("delivered.log")).unwrap_or_default().lines().count()
    }

    /// Delivers a raw message (CRLF lines) straight into the user's
    /// mailbox over LMTP, as a message from outside would arrive.
    pub fn deliver(&self, from: &str, raw: &str) {
        let mut s = TcpStream::connect(("127.0.0.1", self.lmtp_port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut line = String::new();
        let mut expect = |r: &mut BufReader<TcpStream>, code: &str| loop {
            line.clear();
            r.read_line(&mut line).unwrap();
            assert!(line.starts_with(code), "LMTP: expected {code}, got {line:?}");
            if line.as_bytes().get(3) == Some(&b' ') {
                break;
            }
        };
        expect(&mut r, "220");
        for (cmd, code) in [
            ("LHLO test".to_owned(), "250"),
            (format!("MAIL FROM:<{from}>"), "250"),
            (format!("RCPT TO:<{USER}@localhost>"), "250"),
            ("DATA".to_owned(), "354"),
        ] {
            write!(s, "{cmd}\r\n").unwrap();
            expect(&mut r, code);
        }
        let body = raw.replace("\r\n.", "\r\n..");
        write!(s, "{body}\r\n.\r\n").unwrap();
        expect(&mut r, "250");
        write!(s, "QUIT\r\n").unwrap();
    }
}

impl Drop for MailServers {
    fn drop(&mut self) {
        let pids: Vec<i32> = self.children.iter().map(|c| c.id() as i32).collect();
        for p in &pids {
            let _ = rustix::process::kill_process_group(
                rustix::process::Pid::from_raw(*p).unwrap(),
                rustix::process::Signal::TERM,
            );
        }
        choir_common::proc_tree::kill_trees(&pids);
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
