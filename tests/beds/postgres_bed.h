// The PostgreSQL bed for C++ tests: tests/beds/postgres.sh started once per
// test process on a free 127.0.0.1 port, stopped when the process exits (and
// by the script's watchdog if it dies), or the server KVSNAP_PG_URL names
// (a database the tests may create databases from).
//
// Each test takes a fresh database (create_database); raw SQL goes through
// query() in text format, bypassing the code under test.
#pragma once

#include <libpq-fe.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "base/status.h"
#include "loopback.h"

namespace kvsnap {

using PgRows = std::vector<std::vector<std::string>>;

// Runs `sql` (one or more statements) on a new connection; the last statement's rows as text.
inline Result<PgRows> pg_query(const std::string& url, const std::string& sql) {
  PGconn* c = PQconnectdb(url.c_str());
  if (PQstatus(c) != CONNECTION_OK) {
    std::string msg = PQerrorMessage(c);
    PQfinish(c);
    return Status::IOError(url + ": " + msg);
  }
  PGresult* r = PQexec(c, sql.c_str());
  Status s;
  PgRows rows;
  if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK) {
    s = Status::IOError(sql + ": " + PQerrorMessage(c));
  } else {
    for (int i = 0; i < PQntuples(r); ++i) {
      rows.emplace_back();
      for (int j = 0; j < PQnfields(r); ++j) rows.back().push_back(PQgetvalue(r, i, j));
    }
  }
  PQclear(r);
  PQfinish(c);
  if (!s.ok()) return s;
  return rows;
}

class PostgresBed {
 public:
  static PostgresBed& instance() {
    static PostgresBed bed;
    return bed;
  }
  // Empty when the server runs; otherwise why not.
  const std::string& unavailable() const { return unavailable_; }
  // True when the PostgreSQL binaries are missing (the only reason to skip).
  bool not_installed() const { return not_installed_; }
  const std::string& admin_url() const { return admin_url_; }

  // A new empty database; its URL (with `params`, e.g. "application_name=x", when given).
  std::string create_database(std::string* name_out = nullptr) {
    static std::atomic<int> n{0};
    std::string name = "kvsnap_t" + std::to_string(getpid()) + "_" + std::to_string(n++);
    auto r = pg_query(admin_url_, "CREATE DATABASE " + name);
    if (!r.ok()) return "";
    if (name_out) *name_out = name;
    return url_of(name);
  }
  void drop_database(const std::string& name) {
    if (!name.empty()) (void)pg_query(admin_url_, "DROP DATABASE IF EXISTS " + name + " WITH (FORCE)");
  }
  std::string url_of(const std::string& db) const {
    return admin_url_.substr(0, admin_url_.rfind('/') + 1) + db;
  }

  ~PostgresBed() {
    if (!dir_.empty()) std::system(("bash " + script() + " stop " + dir_ + " >/dev/null 2>&1").c_str());
  }

 private:
  static std::string script() { return std::string(KVSNAP_SOURCE_DIR) + "/tests/beds/postgres.sh"; }


  PostgresBed() {
    if (const char* url = std::getenv("KVSNAP_PG_URL"); url && *url) {
      admin_url_ = url;
      return;
    }
    for (int attempt = 0; attempt < 3; ++attempt) {
      std::string tmpl = (std::filesystem::temp_directory_path() / "kvsnap-pg-XXXXXX").string();
      if (!mkdtemp(tmpl.data())) break;
      std::string cmd = "bash " + script() + " start " + tmpl + " " + std::to_string(test::free_port()) + " " +
                        std::to_string(getpid());
      FILE* p = popen(cmd.c_str(), "r");
      std::string out;
      char buf[256];
      while (p && std::fgets(buf, sizeof buf, p)) out += buf;
      int st = p ? pclose(p) : -1;
      int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      if (code == 0 && out.rfind("postgresql://", 0) == 0) {
        while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
        admin_url_ = out;
        dir_ = tmpl;
        return;
      }
      std::filesystem::remove_all(tmpl);
      if (code == 77) {
        not_installed_ = true;
        unavailable_ = "PostgreSQL 15 is not installed (/usr/lib/postgresql/15/bin; tests/install-deps.sh installs it)";
        return;
      }
      unavailable_ = "tests/beds/postgres.sh start failed (exit " + std::to_string(code) + ")";
    }
  }

  std::string admin_url_;
  std::string dir_;
  std::string unavailable_;
  bool not_installed_ = false;
};

}  // namespace kvsnap
