#include "cli/commands.h"

namespace kvsnap::cli {

void setup_all_commands(CLI::App& app, int& exit_status) {
  setup_info(app, exit_status);
  setup_digest(app, exit_status);
  setup_convert(app, exit_status);
  setup_server_commands(app, exit_status);
  setup_save(app, exit_status);
  setup_restore(app, exit_status);
  setup_list_commands(app, exit_status);
  setup_maintain_commands(app, exit_status);
  setup_transfer_commands(app, exit_status);
  setup_migrate(app, exit_status);
  setup_serve(app, exit_status);
  setup_doctor(app, exit_status);
  setup_man(app, exit_status);
  setup_completion(app, exit_status);
}

}  // namespace kvsnap::cli
